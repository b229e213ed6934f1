// flashtree::qdense — y = x @ W^T + b for a weight kept in GGUF blocks of 32 (Q8_0, Q4_0, Q4_1;
// Q4_K as its sub-blocks of 32 with float32 scales),
// by integer dot products (AVX2; AVX512-VNNI's vpdpbusd where the path and the CPU have it).
//
// Why: a decode step streams every weight once; in Q4_1 a weight is 5-6 bits instead of bf16's
// 16, and the file's blocks are what the user has. Dequantizing to bf16 or float32 at load
// (what flashtree did before) streams 3-6x the bytes for no more information.
//
// Layout (made by quant.py from the file's blocks, once at load): qs [N, K] int8 (q8) or
// [N, K/2] uint8 (q4: each 16 bytes hold 16 quants in their low nibbles and the next 16 in their
// high ones, as GGUF stores a block), the quants of each run of 8 blocks interleaved so that one
// 32-byte load holds two groups of 32 (`block_sums`);
// d [N, nbp] block scales (the file's float16, or float32 for a K-quant's sub-blocks) and, for Q4_1, m
// [N, nbp] block offsets of d's type,
// zero past the nb = K/32 blocks up to nbp = a multiple of 8. A q4 weight is d q + m with q in
// 0..15 (Q4_0: m = -8 d); a q8 weight is d q with q in -128..127.
//
// x is quantized here per row in blocks of 32 (the rule in `quantize_row`): xq int8, a scale
// xd and xs = xd * (sum of the block's xq). A row's output is then
//   y[m, n] = sum_b (d[n,b] xd[m,b] isum_b + m[n,b] xs[m,b])  + bias[n]
// with isum_b the exact integer dot product of the block's quants (maddubs + madd; neither
// saturates here: |w| <= 128 against |x| <= 127), summed in eight float32 lanes (see `tile`) and
// reduced in one fixed order: every output is the same sequence of operations whatever the tile,
// the thread or the number of rows, so a row's result never depends on which rows share the call.
//
// Tiles: MR rows of x by NR weight rows keep MR*NR sums in registers over the blocks; a weight
// group is unpacked once per tile and used by MR rows, an x group loaded once and used by NR
// weight rows, and the weight rows' bytes stay in L1 for the later row tiles, so a verify of M
// rows reads the weights from memory once. SmolLM2's Q4_1
// gate/up projection (3072 x 576) at 8 rows took 199 us (2 threads) with a block's float work
// per block, 155 us by eights with the offsets folded in; torch's _weight_int4pack_mm_for_cpu
// and this kernel are compared in docs/cpu-kernels.md.
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>

#include "cpu_kernels.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

constexpr int kB = flashtree_kernels::kBlock;  // weights per block

// The 8-lane sum in one fixed order: halves, then pairs, then the last two.
inline float hsum(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

// 32 q4 quants of one block as unsigned bytes 0..15, in weight order.
inline __m256i unpack_q4(const uint8_t* p) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
  return _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
}

// How far ahead of a tile's block the quants and the scales are prefetched, in bytes: a thread's
// weight rows are one contiguous stream (its later rows included), which the hardware
// prefetcher alone read at about half the bandwidth a bf16 step reaches (SmolLM2's Q4_1
// projections at one row from memory: 7.9 ms without, 5.5 ms at 1 KB / 256 B, 5.7 ms at 2 KB /
// 512 B, 6.1-6.8 ms at 512 / 128 B on the Xeon of benchmarks/quant_2026-12-06). Rows of 2,048
// weights and more (1 KB of q4 quants a row) want the longer distance: Qwen3-1.7B-shaped Q4_0
// projections (28 layers, 793 MB) at one row took 62.7 ms at 1 KB / 256 B, 49.5 at 2 KB / 512 B
// and 50.0 at 4 KB / 1 KB on the AVX2 path (52.7 -> 46.2 ms with vpdpbusd), SmolLM2's the same
// at both (benchmarks/prefetch_2026-12-07).
constexpr int64_t kAheadQ = 2048;
constexpr int64_t kAheadS = 512;

// Eight block scales as float32: float16 (bits; the file's Q8_0 / Q4_0 / Q4_1) or float32 (a
// K-quant's sub-block scales, d x a 6-bit scale: exact in float32, not in float16).
inline __m256 scales8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 scales8(const float* p) { return _mm256_loadu_ps(p); }
inline float scale1(const uint16_t* p) { return _cvtsh_ss(*p); }
inline float scale1(const float* p) { return *p; }

// Eight q4 block offsets from index i: Q4_1's stored m, or Q4_0's -8 d (m null; exact: a power of two).
template <typename Sc>
inline __m256 offsets8(const Sc* m, __m256 dv, int64_t i) {
  return m ? scales8(m + i) : _mm256_mul_ps(dv, _mm256_set1_ps(-8.0f));
}

// Bytes of quants a block takes in a row.
template <bool Q4>
constexpr int64_t block_bytes() { return Q4 ? kB / 2 : kB; }

// The unsigned weight bytes u and the x bytes s signed to match (q8: |w| and sign(x, w)), for
// 32 weight bytes w (q4: already unpacked to 0..15) against 32 x bytes x.
template <bool Q4>
inline void operands(__m256i w, __m256i x, __m256i& u, __m256i& s) {
  if constexpr (Q4) {
    u = w;
    s = x;
  } else {
    u = _mm256_abs_epi8(w);
    s = _mm256_sign_epi8(x, w);
  }
}

// 32 weight bytes at p: q4 nibbles unpacked (16 bytes: low nibbles, then high), q8 as they are.
template <bool Q4>
inline __m256i weight_bytes(const uint8_t* p) {
  if constexpr (Q4) return unpack_q4(p);
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// v kept in a register as it is: the compiler may not re-associate a tile's running sums into
// trees of products (GCC does, for integer adds, and spills the tree's many live values).
inline void pin(__m256i& v) { asm("" : "+x"(v)); }

// Eight int32 lanes of pairwise-summed products (maddubs, then madd with ones).
inline __m256i dot4(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// acc + dot4(u, s) in one AVX512-VNNI instruction (vpdpbusd on ymm registers, EVEX): the same
// exact int32 sums, so both give the same bits. Inline assembly keeps the rest of this file
// compiled for AVX2 (a target attribute would have to cover every function it is inlined into).
// SmolLM2's Q4_1 projections at 8 rows: see docs/cpu-kernels.md.
inline __m256i dot4_vnni(__m256i acc, __m256i u, __m256i s) {
  asm("%{evex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
  return acc;
}

// Whether this process multiplies blocks with vpdpbusd: on the avx512 paths and above
// (FLASHTREE_ISA caps it, as every kernel's path), where the CPU has AVX512-VNNI.
bool vnni_ready() {
  static const bool ok = flashtree_kernels::isa_allows("avx512") && __builtin_cpu_supports("avx512vl") &&
                         __builtin_cpu_supports("avx512vnni");
  return ok;
}

// The exact int32 block sums of superblocks [s0, s1) of MR x rows against NR weight rows:
// out[s - s0][i][j] holds, in dword lane l, the integer dot product of block 8s + l.
//
// Blocks by eights: a row's first 8S blocks (S = nb / 8) are stored interleaved (quant.py's
// `order_by_eights`), so that group g of superblock s holds, in dword lane l, quants 4g..4g+3 of
// block 8s + l — of the weight and of x alike (q4: groups 2h and 2h + 1 share 32 bytes, in the low
// and the high nibbles). Eight maddubs/madd over the groups sum each lane's block exactly.
//
// Each group step loads every weight row's group once into a register and every x row's once,
// then multiplies all MR x NR pairs from registers: MR + NR loads for MR NR products (a load per
// product would meet the two 256-bit loads a cycle at the maddubs ports' own rate, 2 a cycle).
template <int MR, int NR, bool Q4, bool VNNI>
inline void block_sums(const int8_t* __restrict xq, int64_t K, const uint8_t* __restrict qs, int64_t ldq, int64_t s0,
                       int64_t s1, __m256i (*__restrict out)[MR][NR]) {
  constexpr int64_t BB = block_bytes<Q4>();
  // vpdpbusd adds into its accumulator (5 cycles' latency): a tile of fewer than 8 sums keeps two
  // per output (even and odd groups) in flight; maddubs + add are off the chain
  constexpr int H = VNNI && MR * NR < 8 ? 2 : 1;
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  for (int64_t sb = s0; sb < s1; ++sb) {
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j)
#pragma GCC unroll 4
      for (int64_t c = 0; c < 8 * BB; c += 64)
        _mm_prefetch(reinterpret_cast<const char*>(qs + j * ldq + sb * 8 * BB + c + kAheadQ), _MM_HINT_T0);
    __m256i isum[H][MR][NR];
#pragma GCC unroll 16
    for (int h = 0; h < H; ++h)
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
        for (int j = 0; j < NR; ++j) isum[h][i][j] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const int h = H == 2 ? g % 2 : 0;
      __m256i wv[NR], ua[NR];
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) {
        const uint8_t* p = qs + j * ldq + sb * 8 * BB + (Q4 ? (g / 2) * 32 : g * 32);
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        if constexpr (Q4) wv[j] = _mm256_and_si256(g % 2 ? _mm256_srli_epi16(v, 4) : v, low4);
        else wv[j] = v, ua[j] = _mm256_abs_epi8(v);
      }
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * K + sb * 8 * kB + g * kB));
        pin(xv);  // one load for the NR weight rows (folded into each maddubs, it is NR loads)
#pragma GCC unroll 16
        for (int j = 0; j < NR; ++j) {
          const __m256i u = Q4 ? wv[j] : ua[j];
          const __m256i sg = Q4 ? xv : _mm256_sign_epi8(xv, wv[j]);
          if constexpr (VNNI)
            isum[h][i][j] = dot4_vnni(isum[h][i][j], u, sg);
          else if constexpr (Q4)  // int16 pair sums, widened once a superblock (below)
            isum[0][i][j] = _mm256_add_epi16(isum[0][i][j], _mm256_maddubs_epi16(u, sg));
          else
            isum[0][i][j] = _mm256_add_epi32(isum[0][i][j], dot4(u, sg));
          pin(isum[h][i][j]);
        }
      }
    }
    // q4 on AVX2: maddubs's int16 pair sums add up in int16 over a superblock's 8 groups and one
    // madd widens them: a pair is at most 2 * 15 * 127 = 3,810, eight of them 30,480 < 32,767, so
    // the int32 block sums are the same exact integers, with one madd a superblock instead of
    // eight (q8's pairs reach 32,512 and take a madd each)
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) {
        __m256i v = isum[0][i][j];
        if constexpr (Q4 && !VNNI) v = _mm256_madd_epi16(v, _mm256_set1_epi16(1));
        if constexpr (H == 2) v = _mm256_add_epi32(v, isum[1][i][j]);
        out[sb - s0][i][j] = v;
      }
  }
}

// Whether the r = nb % 8 blocks after a row's last whole run share groups (quant.py's
// SHARED_TAILS): r groups whose lane l holds block 8S + l mod r, so one sum holds every tail
// block in lanes. Other tails are stored plainly and added block by block.
inline bool shared_tail(int64_t r) { return r == 1 || r == 2 || r == 4; }

// The exact int32 sums of a shared tail's r groups (S whole runs before it): lane l of
// out[i][j] holds its part of block 8S + l mod r.
template <int R, int MR, int NR, bool Q4, bool VNNI>
inline void tail_sums(const int8_t* __restrict xq, int64_t K, const uint8_t* __restrict qs, int64_t ldq, int64_t S,
                      __m256i (&out)[MR][NR]) {
  constexpr int64_t BB = block_bytes<Q4>();
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  __m256i isum[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) isum[i][j] = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int g = 0; g < R; ++g) {
    __m256i wv[NR], ua[NR];
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      const uint8_t* p = qs + j * ldq + S * 8 * BB;
      if constexpr (Q4) {
        if constexpr (R == 1) {
          wv[j] = unpack_q4(p);  // one group: 16 bytes, as a GGUF block
        } else {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + (g / 2) * 32));
          wv[j] = _mm256_and_si256(g % 2 ? _mm256_srli_epi16(v, 4) : v, low4);
        }
      } else {
        wv[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + g * 32));
        ua[j] = _mm256_abs_epi8(wv[j]);
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * K + S * 8 * kB + g * kB));
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) {
        const __m256i u = Q4 ? wv[j] : ua[j];
        const __m256i sg = Q4 ? xv : _mm256_sign_epi8(xv, wv[j]);
        if constexpr (VNNI)
          isum[i][j] = dot4_vnni(isum[i][j], u, sg);
        else if constexpr (Q4)  // int16 pair sums: at most 4 groups of 3,810
          isum[i][j] = _mm256_add_epi16(isum[i][j], _mm256_maddubs_epi16(u, sg));
        else
          isum[i][j] = _mm256_add_epi32(isum[i][j], dot4(u, sg));
        pin(isum[i][j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j)
      out[i][j] = Q4 && !VNNI ? _mm256_madd_epi16(isum[i][j], _mm256_set1_epi16(1)) : isum[i][j];
}

// acc += a shared tail of R blocks (S whole runs before it): its sums (`tail_sums`), lane l
// scaled by d xd of block 8S + l mod R.
template <int R, int MR, int NR, bool Q4, bool VNNI, typename Sc>
inline void add_tail(const int8_t* __restrict xq, const float* __restrict xd, int64_t K, int64_t nbp,
                     const uint8_t* __restrict qs, int64_t ldq, const Sc* __restrict d, int64_t S, __m256 (&acc)[MR][NR]) {
  __m256i ts[MR][NR];
  tail_sums<R, MR, NR, Q4, VNNI>(xq, K, qs, ldq, S, ts);
  const __m256i lanes = _mm256_setr_epi32(0, 1 % R, 2 % R, 3 % R, 4 % R, 5 % R, 6 % R, 7 % R);
  __m256 xdl[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) xdl[i] = _mm256_permutevar8x32_ps(_mm256_loadu_ps(xd + i * nbp + 8 * S), lanes);
#pragma GCC unroll 16
  for (int j = 0; j < NR; ++j) {
    const __m256 dl = _mm256_permutevar8x32_ps(scales8(d + j * nbp + 8 * S), lanes);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
      acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ts[i][j]), _mm256_mul_ps(dl, xdl[i]), acc[i][j]);
  }
}

// y[MR, NR] (row stride ldy) for x rows xq/xd/xs and weight rows qs/d/m.
//
// Superblocks a chunk at a time: their integer sums first (`block_sums`, kept in a small buffer),
// then one conversion and one multiply-add by the eight blocks' scales (d[8s..8s+8) xd[8s..8s+8),
// two vector loads) add each superblock to the float sums in order: the float work of eight blocks
// in two instructions, the float sums kept in registers only while the integer ones are not. The
// nb % 8 blocks after: a shared tail (`shared_tail`) by one sum and one multiply-add of its lanes'
// scales (`add_tail`), any other block by block (its sum broadcast by its scale).
template <int MR, int NR, bool Q4, bool VNNI, typename Sc>
inline void tile(const int8_t* __restrict xq, const float* __restrict xd, const float* __restrict xs, int64_t K,
                 int64_t nbp, const uint8_t* __restrict qs, int64_t ldq, const Sc* __restrict d,
                 const Sc* __restrict m, float* __restrict y, int64_t ldy, const float* __restrict bias) {
  constexpr int64_t BB = block_bytes<Q4>();
  constexpr int64_t kChunk = 8;  // superblocks a chunk: 2,048 weights, MR NR 256 bytes of sums each
  const int64_t nb = K / kB, S = nb / 8;
  __m256 acc[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  alignas(32) __m256i sums[kChunk][MR][NR];
  for (int64_t s0 = 0; s0 < S; s0 += kChunk) {
    const int64_t s1 = std::min(S, s0 + kChunk);
    block_sums<MR, NR, Q4, VNNI>(xq, K, qs, ldq, s0, s1, sums);
    for (int64_t sb = s0; sb < s1; ++sb) {
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(d + j * nbp + 8 * sb) + kAheadS, _MM_HINT_T0);
        if (m) _mm_prefetch(reinterpret_cast<const char*>(m + j * nbp + 8 * sb) + kAheadS, _MM_HINT_T0);
        const __m256 dv = scales8(d + j * nbp + 8 * sb);
        const __m256 mv = Q4 ? offsets8(m, dv, j * nbp + 8 * sb) : dv;
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
          acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[sb - s0][i][j]),
                                      _mm256_mul_ps(dv, _mm256_loadu_ps(xd + i * nbp + 8 * sb)), acc[i][j]);
          if constexpr (Q4) acc[i][j] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(xs + i * nbp + 8 * sb), acc[i][j]);
        }
      }
    }
  }
  const int64_t r = nb - 8 * S;
  if (shared_tail(r)) {  // one sum a tile output, its lanes scaled by their blocks' d xd
    if (r == 1) add_tail<1, MR, NR, Q4, VNNI, Sc>(xq, xd, K, nbp, qs, ldq, d, S, acc);
    else if (r == 2) add_tail<2, MR, NR, Q4, VNNI, Sc>(xq, xd, K, nbp, qs, ldq, d, S, acc);
    else add_tail<4, MR, NR, Q4, VNNI, Sc>(xq, xd, K, nbp, qs, ldq, d, S, acc);
  } else {
    for (int64_t b = 8 * S; b < nb; ++b) {  // a plain tail
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) {
        const __m256i w = weight_bytes<Q4>(qs + j * ldq + b * BB);
        const float dw = scale1(d + j * nbp + b);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
          __m256i u, sg;
          operands<Q4>(w, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * K + b * kB)), u, sg);
          acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot4(u, sg)), _mm256_set1_ps(dw * xd[i * nbp + b]), acc[i][j]);
        }
      }
    }
  }
  if constexpr (Q4) {  // the tail's offsets: its blocks (and zeros past them) in one run of eight lanes
    if (8 * S < nb) {
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) {
        const __m256 mv = offsets8(m, scales8(d + j * nbp + 8 * S), j * nbp + 8 * S);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(xs + i * nbp + 8 * S), acc[i][j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      const float v = hsum(acc[i][j]);
      y[i * ldy + j] = bias ? v + bias[j] : v;
    }
}

// Tile shapes. One x row (a decode step): three weight rows a tile (SmolLM2's Q4_1 projections and
// Q8_0 head took a median 0.85x the time of two on a Zen 3, benchmarks/zen3_2026-12-07/tile_1x3).
// More rows: four x rows by two weight rows, the x rows left by two weight rows, the weight rows
// left one at a time (on the Zen 3, AVX2, SmolLM2's projection set at 8 rows: 4 x 2 0.85x the time of
// the previous kernel, 2 x 4 0.89x, 2 x 3 0.91x; benchmarks/zen3_2026-12-08/qdense_tiles).
constexpr int kStepCols = 3, kRows = 4, kCols = 2;

// Every x row against NR weight rows from n: x rows kRows at a time, then the 1..kRows-1 left.
template <int NR, bool Q4, bool VNNI, typename Sc>
void column(const int8_t* xq, const float* xd, const float* xs, int64_t M, int64_t K, int64_t nbp, const uint8_t* qs,
            int64_t ldq, const Sc* d, const Sc* m, float* y, int64_t N, const float* bias, int64_t n) {
  const uint8_t* q = qs + n * ldq;
  const Sc* dn = d + n * nbp;
  const Sc* mn = m ? m + n * nbp : nullptr;
  const float* bn = bias ? bias + n : nullptr;
  int64_t i = 0;
  for (; i + kRows <= M; i += kRows)
    tile<kRows, NR, Q4, VNNI, Sc>(xq + i * K, xd + i * nbp, xs + i * nbp, K, nbp, q, ldq, dn, mn, y + i * N + n, N, bn);
  auto rest = [&](auto mr) {
    tile<decltype(mr)::value, NR, Q4, VNNI, Sc>(xq + i * K, xd + i * nbp, xs + i * nbp, K, nbp, q, ldq, dn, mn,
                                                y + i * N + n, N, bn);
  };
  static_assert(kRows == 4);
  switch (M - i) {
    case 3: rest(std::integral_constant<int, 3>{}); break;
    case 2: rest(std::integral_constant<int, 2>{}); break;
    case 1: rest(std::integral_constant<int, 1>{}); break;
    default: break;
  }
}

// Every x row against weight rows [n0, n1), by the tile shapes above. Every output is the same
// sequence of operations whatever the tile (see `tile`), so a row's bits never depend on them.
template <bool Q4, bool VNNI, typename Sc>
void rows(const int8_t* xq, const float* xd, const float* xs, int64_t M, int64_t K, int64_t nbp,
          const uint8_t* qs, int64_t ldq, const Sc* d, const Sc* m, float* y, int64_t N,
          const float* bias, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (M == 1) {
    for (; n + kStepCols <= n1; n += kStepCols)
      tile<1, kStepCols, Q4, VNNI, Sc>(xq, xd, xs, K, nbp, qs + n * ldq, ldq, d + n * nbp, m ? m + n * nbp : nullptr,
                                       y + n, N, bias ? bias + n : nullptr);
  } else {
    for (; n + kCols <= n1; n += kCols) column<kCols, Q4, VNNI, Sc>(xq, xd, xs, M, K, nbp, qs, ldq, d, m, y, N, bias, n);
  }
  for (; n < n1; ++n) column<1, Q4, VNNI, Sc>(xq, xd, xs, M, K, nbp, qs, ldq, d, m, y, N, bias, n);
}

// x quants of one row in the weights' order (quant.py's `order_by_eights` for q8): runs by eights, a shared tail in lanes.
void interleave_row(const int8_t* plain, int64_t K, int8_t* out) {
  const int64_t nb = K / kB, S = nb / 8, r = nb % 8;
  for (int64_t sb = 0; sb < S; ++sb)
    for (int g = 0; g < 8; ++g)
      for (int l = 0; l < 8; ++l)
        std::memcpy(out + sb * 256 + g * 32 + l * 4, plain + (sb * 8 + l) * kB + 4 * g, 4);
  if (!shared_tail(r)) {
    std::memcpy(out + S * 256, plain + S * 256, K - S * 256);
    return;
  }
  for (int g = 0; g < r; ++g)  // lane l: block 8S + l mod r, its chunk g (8 / r) + l / r
    for (int l = 0; l < 8; ++l)
      std::memcpy(out + S * 256 + g * 32 + l * 4, plain + (8 * S + l % r) * kB + 4 * (g * (8 / r) + l / r), 4);
}

// x [..., K] float32, bfloat16 or float64 (quantized from float32 all the same); qs [N, K] int8 or
// [N, K/2] uint8; d, m [N, nbp] float16 (m: Q4_1 only; Q4_0's offsets are -8 d); bias [N] or none
// -> [..., N] in x's dtype.
at::Tensor qdense(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, const std::optional<at::Tensor>& m,
                  const std::optional<at::Tensor>& bias) {
  const auto dt = x.scalar_type();
  TORCH_CHECK(x.device().is_cpu() && (dt == at::kFloat || dt == at::kBFloat16 || dt == at::kDouble),
              "flashtree::qdense: x must be float32, bfloat16 or float64 (the tests' models) on the CPU");
  const bool q4 = qs.scalar_type() == at::kByte;
  TORCH_CHECK(q4 || qs.scalar_type() == at::kChar, "flashtree::qdense: qs must be int8 (q8) or uint8 (q4)");
  TORCH_CHECK(qs.dim() == 2 && qs.is_contiguous(), "flashtree::qdense: qs must be [N, K or K/2], contiguous");
  const int64_t N = qs.size(0), K = q4 ? 2 * qs.size(1) : qs.size(1);
  TORCH_CHECK(K % kB == 0, "flashtree::qdense: K must be a multiple of 32");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, "flashtree::qdense: x has ", x.size(-1), " features, the weight ", K);
  const int64_t nbp = d.size(-1);
  const bool f32 = d.scalar_type() == at::kFloat;
  TORCH_CHECK(d.dim() == 2 && d.size(0) == N && nbp % 8 == 0 && nbp >= K / kB && d.is_contiguous() &&
                  (d.scalar_type() == at::kHalf || f32),
              "flashtree::qdense: d must be [N, a multiple of 8 >= K/32] float16 or float32, contiguous");
  TORCH_CHECK(q4 || !m.has_value(), "flashtree::qdense: m goes with q4 weights only");
  if (m.has_value())
    TORCH_CHECK(m->sizes() == d.sizes() && m->is_contiguous() && m->scalar_type() == d.scalar_type(),
                "flashtree::qdense: m must be shaped and typed as d");
  if (bias.has_value())
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N, "flashtree::qdense: bias must be [N]");
  int64_t M = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) M *= x.size(i);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  at::Tensor y = at::empty(shape, x.options().dtype(at::kFloat));
  if (M == 0 || N == 0) return y.to(dt);
  const at::Tensor x2 = x.reshape({M, K}).to(at::kFloat).contiguous();
  const at::Tensor b2 = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  std::vector<int8_t> xq(M * K);
  std::vector<float> xd(M * nbp), xs(M * nbp);
  const float* xp = x2.data_ptr<float>();
  std::vector<int8_t> plain(K);
  for (int64_t i = 0; i < M; ++i) {
    flashtree_kernels::quantize_row(xp + i * K, K, plain.data(), &xd[i * nbp], &xs[i * nbp], nbp);
    interleave_row(plain.data(), K, &xq[i * K]);
  }
  const float* bp = bias.has_value() ? b2.data_ptr<float>() : nullptr;
  const uint8_t* q = reinterpret_cast<const uint8_t*>(qs.data_ptr());
  float* yp = y.data_ptr<float>();
  const int64_t ldq = qs.size(1);
  const bool vnni = vnni_ready();
  // shares of whole runs of 6 rows (a multiple of every tile's weight rows), as the float kernel's panels (panel_shares' rule)
  const int64_t units = (N + 5) / 6;
  const int64_t shares = flashtree_kernels::panel_shares(units, 6, M * N * K, at::get_num_threads());
  at::parallel_for(0, shares, 1, [&](int64_t s0, int64_t s1) {
    const int64_t n0 = std::min(N, 6 * flashtree_kernels::share_start(units, s0, shares));
    const int64_t n1 = std::min(N, 6 * flashtree_kernels::share_start(units, s1, shares));
    auto typed = [&](auto q4_, auto vnni_, const auto* dp) {
      using Sc = std::remove_cv_t<std::remove_pointer_t<decltype(dp)>>;
      const Sc* mp = m.has_value() ? static_cast<const Sc*>(m->data_ptr()) : nullptr;
      rows<decltype(q4_)::value, decltype(vnni_)::value, Sc>(xq.data(), xd.data(), xs.data(), M, K, nbp, q, ldq, dp,
                                                              mp, yp, N, bp, n0, n1);
    };
    auto run = [&](auto q4_, auto vnni_) {  // the scales' type: float32 (a K-quant's) or float16 bits
      if (f32) typed(q4_, vnni_, static_cast<const float*>(d.data_ptr()));
      else typed(q4_, vnni_, static_cast<const uint16_t*>(d.data_ptr()));
    };
    if (vnni)
      q4 ? run(std::true_type{}, std::true_type{}) : run(std::false_type{}, std::true_type{});
    else
      q4 ? run(std::true_type{}, std::false_type{}) : run(std::false_type{}, std::false_type{});
  });
  return dt == at::kFloat ? y : y.to(dt);
}

// The row quantization alone (for the tests' reference): x [M, K] float32 -> (xq [M, K] int8,
// xd [M, nbp], xs [M, nbp]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x, int64_t nbp) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.size(1) % kB == 0 && nbp >= x.size(1) / kB,
              "flashtree::quantize_rows: x must be [M, K] float32 with K a multiple of 32");
  const at::Tensor xc = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor xq = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor xd = at::empty({M, nbp}, x.options()), xs = at::empty({M, nbp}, x.options());
  for (int64_t i = 0; i < M; ++i)
    flashtree_kernels::quantize_row(xc.data_ptr<float>() + i * K, K, xq.data_ptr<int8_t>() + i * K, xd.data_ptr<float>() + i * nbp,
                 xs.data_ptr<float>() + i * nbp, nbp);
  return {xq, xd, xs};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(flashtree, m) {
  m.def("qdense(Tensor x, Tensor qs, Tensor d, Tensor? m, Tensor? bias) -> Tensor");
  m.def("quantize_rows(Tensor x, int nbp) -> (Tensor, Tensor, Tensor)");
  m.def("qdense_dot() -> str", [] { return std::string(vnni_ready() ? "vpdpbusd" : "maddubs"); });
}

TORCH_LIBRARY_IMPL(flashtree, CPU, m) {
  m.impl("qdense", &qdense);
  m.impl("quantize_rows", &quantize_rows);
}
