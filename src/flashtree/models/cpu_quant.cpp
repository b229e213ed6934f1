// flashtree::qdense — y = x @ W^T + b for a weight kept in GGUF blocks of 32 (Q8_0, Q4_0, Q4_1),
// by integer dot products (AVX2; AVX-VNNI / AVX512-VNNI where the path allows them).
//
// Why: a decode step streams every weight once; in Q4_1 a weight is 5-6 bits instead of bf16's
// 16, and the file's blocks are what the user has. Dequantizing to bf16 or float32 at load
// (what flashtree did before) streams 3-6x the bytes for no more information.
//
// Layout (made by quant.py from the file's blocks, once at load): qs [N, K] int8 (q8) or
// [N, K/2] uint8 (q4: byte j of block b holds weight 32b + j in its low nibble and 32b + j + 16
// in its high nibble, as GGUF stores them); d [N, nbp] float32 block scales and, for q4, m [N,
// nbp] float32 block offsets (Q4_0's -8 d), zero past the nb = K/32 blocks up to nbp = a
// multiple of 8. A q4 weight is d q + m with q in 0..15; a q8 weight is d q with q in -128..127.
//
// x is quantized here per row in blocks of 32 (the rule in `quantize_row`): xq int8, a scale
// xd and xs = xd * (sum of the block's xq). A row's output is then
//   y[m, n] = sum_b (d[n,b] xd[m,b]) * isum_b  +  sum_b m[n,b] xs[m,b]  + bias[n]
// with isum_b the exact integer dot product of the block's quants (maddubs + madd, or vpdpbusd;
// neither saturates here: |w| <= 128 against |x| <= 127). The first sum accumulates in eight
// float32 lanes block by block, the second in eight lanes eight blocks at a time, each reduced
// in one fixed order: every output is the same sequence of operations whatever the tile, the
// thread or the number of rows, so a row's result never depends on which rows share the call.
//
// Tiles: MR rows of x by NR weight rows keep MR*NR sums in registers over the blocks; a weight
// block is unpacked once per tile and used by MR rows, and the NR rows' bytes stay in L1 for the
// later row tiles, so a verify of M rows reads the weights from memory once.
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>

#include "cpu_kernels.h"

#include <algorithm>
#include <vector>

namespace {

constexpr int kB = 32;  // weights per block

// The q8 row quantization of x: for each block of 32, amax = max |x|, xd = amax / 127,
// xq = round-half-even(x * (127 / amax)) (0 where amax is 0), xs = xd * sum(xq).
void quantize_row(const float* x, int64_t K, int8_t* xq, float* xd, float* xs, int64_t nbp) {
  const int64_t nb = K / kB;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + b * kB + 8 * i);
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    const float d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], idv));  // nearest, ties even
    // int32 x 32 -> int8 x 32 in order (packs interleave the 128-bit lanes: undo with a permute)
    const __m256i p01 = _mm256_packs_epi32(q[0], q[1]), p23 = _mm256_packs_epi32(q[2], q[3]);
    __m256i p = _mm256_packs_epi16(p01, p23);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + b * kB), p);
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    xd[b] = d;
    xs[b] = d * static_cast<float>(_mm_cvtsi128_si32(t));
  }
  for (int64_t b = nb; b < nbp; ++b) xd[b] = xs[b] = 0.0f;
}

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

// isum of unsigned weight bytes u by signed x bytes s, eight int32 lanes.
struct DotAvx2 {
  static inline __m256i dot(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
  }
};

template <bool Q4>
struct Weights {
  const uint8_t* qs;  // this tile's first row
  int64_t ldq;        // bytes a row
  // unsigned weight bytes of block b of row n and x bytes signed to match (q8: |w| and sign(x, w))
  static inline void operands(const uint8_t* row, int64_t b, __m256i x, __m256i& u, __m256i& s) {
    if constexpr (Q4) {
      u = unpack_q4(row + b * (kB / 2));
      s = x;
    } else {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * kB));
      u = _mm256_abs_epi8(w);
      s = _mm256_sign_epi8(x, w);
    }
  }
};

// How far ahead of a tile's block the quants and the scales are prefetched, in bytes: a thread's
// weight rows are one contiguous stream (its later rows included), which the hardware
// prefetcher alone read at about half the bandwidth a bf16 step reaches (SmolLM2's Q4_1
// projections at one row from memory: 7.9 ms without, 5.5 ms at 1 KB / 256 B, 5.7 ms at 2 KB /
// 512 B, 6.1-6.8 ms at 512 / 128 B on the Xeon of benchmarks/quant_2026-12-06).
constexpr int64_t kAheadQ = 1024;
constexpr int64_t kAheadS = 256;

// y[MR, NR] (row stride ldy) for x rows xq/xd/xs and weight rows qs/d/m (nb blocks, nbp padded).
template <int MR, int NR, bool Q4, typename Dot>
inline void tile(const int8_t* __restrict xq, const float* __restrict xd, const float* __restrict xs, int64_t K,
                 int64_t nbp, const uint8_t* __restrict qs, int64_t ldq, const float* __restrict d,
                 const float* __restrict m, float* __restrict y, int64_t ldy, const float* __restrict bias) {
  const int64_t nb = K / kB;
  __m256 acc[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i xv[MR];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) xv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * K + b * kB));
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      const uint8_t* row = qs + j * ldq;
      _mm_prefetch(reinterpret_cast<const char*>(row + b * (Q4 ? kB / 2 : kB) + kAheadQ), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(d + j * nbp + b) + kAheadS, _MM_HINT_T0);
      if constexpr (Q4) _mm_prefetch(reinterpret_cast<const char*>(m + j * nbp + b) + kAheadS, _MM_HINT_T0);
      const float dw = d[j * nbp + b];
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        __m256i u, s;
        Weights<Q4>::operands(row, b, xv[i], u, s);
        const __m256 scale = _mm256_set1_ps(dw * xd[i * nbp + b]);
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Dot::dot(u, s)), scale, acc[i][j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      float v = hsum(acc[i][j]);
      if constexpr (Q4) {
        __m256 macc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nbp; b += 8)
          macc = _mm256_fmadd_ps(_mm256_loadu_ps(m + j * nbp + b), _mm256_loadu_ps(xs + i * nbp + b), macc);
        v += hsum(macc);
      }
      y[i * ldy + j] = bias ? v + bias[j] : v;
    }
}

// Every x row against weight rows [n, n + NR): x rows four at a time, then the 1..3 left.
template <int NR, bool Q4, typename Dot>
void strip(const int8_t* xq, const float* xd, const float* xs, int64_t M, int64_t K, int64_t nbp, const uint8_t* qs,
           int64_t ldq, const float* d, const float* m, float* y, int64_t N, const float* bias, int64_t n) {
  const uint8_t* q = qs + n * ldq;
  const float* dn = d + n * nbp;
  const float* mn = Q4 ? m + n * nbp : nullptr;
  const float* bn = bias ? bias + n : nullptr;
  int64_t i = 0;
  for (; i + 4 <= M; i += 4)
    tile<4, NR, Q4, Dot>(xq + i * K, xd + i * nbp, xs + i * nbp, K, nbp, q, ldq, dn, mn, y + i * N + n, N, bn);
  const int8_t* xi = xq + i * K;
  const float* di = xd + i * nbp;
  const float* si = xs + i * nbp;
  float* yi = y + i * N + n;
  switch (M - i) {
    case 3: tile<3, NR, Q4, Dot>(xi, di, si, K, nbp, q, ldq, dn, mn, yi, N, bn); break;
    case 2: tile<2, NR, Q4, Dot>(xi, di, si, K, nbp, q, ldq, dn, mn, yi, N, bn); break;
    case 1: tile<1, NR, Q4, Dot>(xi, di, si, K, nbp, q, ldq, dn, mn, yi, N, bn); break;
    default: break;
  }
}

// Every x row against weight rows [n0, n1), two weight rows at a time (one at the end).
template <bool Q4, typename Dot>
void rows(const int8_t* xq, const float* xd, const float* xs, int64_t M, int64_t K, int64_t nbp,
          const uint8_t* qs, int64_t ldq, const float* d, const float* m, float* y, int64_t N,
          const float* bias, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) strip<2, Q4, Dot>(xq, xd, xs, M, K, nbp, qs, ldq, d, m, y, N, bias, n);
  if (n < n1) strip<1, Q4, Dot>(xq, xd, xs, M, K, nbp, qs, ldq, d, m, y, N, bias, n);
}

// x [..., K] float32, bfloat16 or float64 (quantized from float32 all the same); qs [N, K] int8 or [N, K/2] uint8; d, m [N, nbp] float32 (m for
// q4 only); bias [N] float32 or none -> [..., N] in x's dtype.
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
  TORCH_CHECK(d.dim() == 2 && d.size(0) == N && nbp % 8 == 0 && nbp >= K / kB && d.is_contiguous() &&
                  d.scalar_type() == at::kFloat,
              "flashtree::qdense: d must be [N, a multiple of 8 >= K/32] float32, contiguous");
  TORCH_CHECK(q4 == m.has_value(), "flashtree::qdense: m goes with q4 weights only");
  if (q4)
    TORCH_CHECK(m->sizes() == d.sizes() && m->is_contiguous() && m->scalar_type() == at::kFloat,
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
  for (int64_t i = 0; i < M; ++i) quantize_row(xp + i * K, K, &xq[i * K], &xd[i * nbp], &xs[i * nbp], nbp);
  const float* bp = bias.has_value() ? b2.data_ptr<float>() : nullptr;
  const uint8_t* q = reinterpret_cast<const uint8_t*>(qs.data_ptr());
  const float* dp = d.data_ptr<float>();
  const float* mp = q4 ? m->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t ldq = qs.size(1);
  // shares of whole row pairs, as the float kernel's panels (panel_shares' rule)
  const int64_t pairs = (N + 1) / 2;
  const int64_t shares = flashtree_kernels::panel_shares(pairs, 16, M * N * K, at::get_num_threads());
  at::parallel_for(0, shares, 1, [&](int64_t s0, int64_t s1) {
    const int64_t n0 = 2 * flashtree_kernels::share_start(pairs, s0, shares);
    const int64_t n1 = std::min(N, 2 * flashtree_kernels::share_start(pairs, s1, shares));
    if (q4)
      rows<true, DotAvx2>(xq.data(), xd.data(), xs.data(), M, K, nbp, q, ldq, dp, mp, yp, N, bp, n0, n1);
    else
      rows<false, DotAvx2>(xq.data(), xd.data(), xs.data(), M, K, nbp, q, ldq, dp, mp, yp, N, bp, n0, n1);
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
    quantize_row(xc.data_ptr<float>() + i * K, K, xq.data_ptr<int8_t>() + i * K, xd.data_ptr<float>() + i * nbp,
                 xs.data_ptr<float>() + i * nbp, nbp);
  return {xq, xd, xs};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(flashtree, m) {
  m.def("qdense(Tensor x, Tensor qs, Tensor d, Tensor? m, Tensor? bias) -> Tensor");
  m.def("quantize_rows(Tensor x, int nbp) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(flashtree, CPU, m) {
  m.impl("qdense", &qdense);
  m.impl("quantize_rows", &quantize_rows);
}
