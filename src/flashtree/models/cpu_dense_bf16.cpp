// flashtree::dense_bf16 — y = x @ W^T + b in bfloat16 with AVX512-BF16 dot products (vdpbf16ps).
//
// Why: a bf16 decode step is bound by streaming the weights (269 MB a token for SmolLM2-135M).
// oneDNN's bf16 linear took 26.7 ms for its 121 projections at one row on the reference Xeon
// (AMX, 2 cores), this kernel 12.8 ms (benchmarks/real_model_2026-12-03/projections_bf16_amx0.json,
// benchmarks/real_model_2026-12-03/measure_projections.py); vdpbf16ps multiplies 32
// bf16 weights by a broadcast pair of x in one instruction.
//
// How: the weight [N, K] is packed once into panels of 16 output columns holding k in pairs:
// packed[p, j, c, e] = W[16p + c, 2j + e] (zero past N and K), so one k pair of a panel is one
// 64-byte load. A tile of MR rows x P panels keeps MR*P sixteen-float sums in registers for the
// whole k loop; threads split the panels into near-equal contiguous shares.
//
// With AMX (amx_bf16, the OS granting its tile state) every call runs on tiles instead: 16 rows
// of x (zero-padded) by 16 k pairs against a panel's 16 k pairs by 16 columns — the same packed
// layout — so a 16-row verify streams the weights once at the cost of one row; vdpbf16ps,
// compute-bound from ~4 rows here, stays the path of CPUs without AMX.
//
// Every output is the same sum whatever the tile, the thread or the number of rows: for each
// pair j in order, acc += x[2j] w[2j] + x[2j+1] w[2j+1] (float32 accumulation), then + b[n],
// rounded to bf16 once; one CPU always takes one path (AMX or not, for every row count), so a
// row's result never depends on which rows share the call — batch-invariant. It differs from
// at::linear's rounding, which no exactness check compares against (exactness holds within
// one engine and dtype). K is padded to a multiple of 32 (16 pairs, one tile's depth) with zeros.
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <immintrin.h>

#include "cpu_kernels.h"


#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kW = 16;            // panel width: one 16-float vector
constexpr int kAhead = 16;        // k pairs (64-byte lines) each panel's stream is prefetched ahead
constexpr int64_t kAmxAhead = 2;  // 16-pair blocks (16 lines) each panel is prefetched ahead on tiles
constexpr int64_t kMaxRows = 256;  // matches MAX_ROWS in cpu_dense.py

#define FT_BF16 __attribute__((target("avx512f,avx512bf16")))

// The first n lanes of 16 (n >= 16: all).
inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// Stores the first n (<= 16) lanes of v as bfloat16, rounded to nearest even as at::BFloat16 rounds
// (NaN -> 0x7FC0): what y.to(torch.bfloat16) of the float32 sums gives, without a float32 output
// tensor and a second op to convert it for each of a step's calls (benchmarks/bf16_store_2026-12-05).
__attribute__((target("avx512f"))) inline void store_bf16(uint16_t* dst, __m512 v, int64_t n) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm512_mask_cvtepi32_storeu_epi16(dst, lanes(n), r);
}

// v + bias[0..n) (n <= 16 lanes read), or v without a bias.
__attribute__((target("avx512f"))) inline __m512 add_bias(__m512 v, const float* bias, int64_t n) {
  if (!bias) return v;
  return _mm512_add_ps(v, _mm512_maskz_loadu_ps(lanes(n), bias));
}

// y[MR, <=16P] (bf16) = x[MR, 2*K2] (bf16 pairs) @ panels[P]; ncols = valid columns from this tile's first.
template <int MR, int P>
FT_BF16 inline void tile(const uint32_t* __restrict x, int64_t ldx, const uint16_t* __restrict wp, int64_t K2,
                         uint16_t* __restrict y, int64_t ldy, const float* __restrict bias, int64_t ncols) {
  __m512 acc[MR][P];
#pragma GCC unroll 32
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 32
    for (int p = 0; p < P; ++p) acc[m][p] = _mm512_setzero_ps();
  const int64_t ps = K2 * 2 * kW;  // bf16 per panel
  for (int64_t j = 0; j < K2; ++j) {
    __m512bh w[P];
#pragma GCC unroll 32
    for (int p = 0; p < P; ++p) {
      _mm_prefetch(reinterpret_cast<const char*>(wp + p * ps + (j + kAhead) * 2 * kW), _MM_HINT_T0);
      w[p] = (__m512bh)_mm512_loadu_si512(wp + p * ps + j * 2 * kW);
    }
#pragma GCC unroll 32
    for (int m = 0; m < MR; ++m) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[m * ldx + j]));
#pragma GCC unroll 32
      for (int p = 0; p < P; ++p) acc[m][p] = _mm512_dpbf16_ps(acc[m][p], xb, w[p]);
    }
  }
#pragma GCC unroll 32
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 32
    for (int p = 0; p < P; ++p) {
      const int64_t c0 = p * kW, n = std::min<int64_t>(kW, ncols - c0);
      if (n > 0) store_bf16(y + m * ldy + c0, add_bias(acc[m][p], bias ? bias + c0 : nullptr, n), n);
    }
}

// MR rows over np panels: 8 panels a tile for one row, 4 for two, 2 for 3..8 (8-16 sums).
template <int MR>
FT_BF16 inline void tiles(const uint32_t* x, int64_t ldx, const uint16_t* wp, int64_t np, int64_t K2, uint16_t* y,
                          int64_t ldy, const float* bias, int64_t ncols) {
  constexpr int P = MR == 1 ? 8 : (MR == 2 ? 4 : 2);
  const int64_t ps = K2 * 2 * kW;
  int64_t q = 0;
  for (; q + P <= np; q += P)
    tile<MR, P>(x, ldx, wp + q * ps, K2, y + q * kW, ldy, bias ? bias + q * kW : nullptr, ncols - q * kW);
  for (; q < np; ++q)
    tile<MR, 1>(x, ldx, wp + q * ps, K2, y + q * kW, ldy, bias ? bias + q * kW : nullptr, ncols - q * kW);
}

FT_BF16 void rows(const uint32_t* x, int64_t ldx, int64_t M, const uint16_t* wp, int64_t np, int64_t K2, uint16_t* y,
                  int64_t ldy, const float* bias, int64_t ncols) {
  int64_t m = 0;
  for (; m + 8 <= M; m += 8) tiles<8>(x + m * ldx, ldx, wp, np, K2, y + m * ldy, ldy, bias, ncols);
  const uint32_t* xm = x + m * ldx;
  uint16_t* ym = y + m * ldy;
  switch (M - m) {
    case 7: tiles<7>(xm, ldx, wp, np, K2, ym, ldy, bias, ncols); break;
    case 6: tiles<6>(xm, ldx, wp, np, K2, ym, ldy, bias, ncols); break;
    case 5: tiles<5>(xm, ldx, wp, np, K2, ym, ldy, bias, ncols); break;
    case 4: tiles<4>(xm, ldx, wp, np, K2, ym, ldy, bias, ncols); break;
    case 3: tiles<3>(xm, ldx, wp, np, K2, ym, ldy, bias, ncols); break;
    case 2: tiles<2>(xm, ldx, wp, np, K2, ym, ldy, bias, ncols); break;
    case 1: tiles<1>(xm, ldx, wp, np, K2, ym, ldy, bias, ncols); break;
    default: break;
  }
}

bool cpu_has_bf16_dot() {
  return flashtree_kernels::isa_allows("avx512_bf16") && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bf16");
}

#define FT_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bf16")))

// AMX on this CPU, with the OS's permission for this process's tile data (Linux asks for it),
// unless FLASHTREE_ISA names a lower path. A one-row call costs about what vdpbf16ps's does (plain decoding
// within noise of it; it cost 1.3x before tiles prefetched and held just the M rows), and a
// 17-row verify streams the weights once instead of being compute-bound from ~4 rows
// (benchmarks/xeon_amx_2026-12-04, benchmarks/amx_prefetch_2026-12-05).
bool amx_ready() {
  static const bool ok = [] {
    if (!flashtree_kernels::isa_allows("amx")) return false;
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16")) return false;
    return flashtree_kernels::tile_data_granted();
  }();
  return ok;
}

// One thread's panels [np at wp] for every row: x [Mp, K2] pairs (Mp = M up to 16, else a multiple
// of 16 with zero rows past M), K2 a multiple of 16. Tiles: 0-3 four panels' sums, 4 a block of
// x, 5-6 a panel's block. A tile of x holds min(Mp, 16) rows: a one-row step neither loads nor
// multiplies 15 rows of zeros.
FT_AMX void amx_rows(const uint32_t* x, int64_t K2, int64_t M, int64_t Mp, const uint16_t* wp, int64_t np,
                     uint16_t* y, int64_t ldy, const float* bias, int64_t ncols) {
  flashtree_kernels::TileConfig cfg;
  const int tr = static_cast<int>(std::min<int64_t>(16, Mp));  // rows of x a tile holds: M when M <= 16
  for (int t = 0; t < 7; ++t) cfg.rows[t] = t < 5 ? tr : 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
  alignas(64) float buf[4][16 * 16];
  const int64_t ps = K2 * 2 * kW;
  for (int64_t q = 0; q < np; q += 4) {
    const int64_t nq = std::min<int64_t>(4, np - q);
    const uint16_t* w0 = wp + q * ps;
    for (int64_t m0 = 0; m0 < Mp; m0 += 16) {  // later row blocks read these panels from the cache
      const uint32_t* xa = x + m0 * K2;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int64_t j = 0; j < K2; j += 16) {
        // each panel's block kAmxAhead blocks on, for the first row block: tile loads are not
        // prefetched from memory as the dot path's vector loads are
        if (m0 == 0)
          for (int64_t t = 0; t < nq; ++t)
#pragma GCC unroll 16
            for (int l = 0; l < 16; ++l)
              _mm_prefetch(reinterpret_cast<const char*>(w0 + t * ps + (j + 16 * kAmxAhead + l) * 2 * kW), _MM_HINT_T0);
        _tile_loadd(4, xa + j, K2 * 4);
        _tile_loadd(5, w0 + j * 2 * kW, 64);
        _tile_dpbf16ps(0, 4, 5);
        if (nq > 1) { _tile_loadd(6, w0 + ps + j * 2 * kW, 64); _tile_dpbf16ps(1, 4, 6); }
        if (nq > 2) { _tile_loadd(5, w0 + 2 * ps + j * 2 * kW, 64); _tile_dpbf16ps(2, 4, 5); }
        if (nq > 3) { _tile_loadd(6, w0 + 3 * ps + j * 2 * kW, 64); _tile_dpbf16ps(3, 4, 6); }
      }
      _tile_stored(0, buf[0], 64); _tile_stored(1, buf[1], 64);
      _tile_stored(2, buf[2], 64); _tile_stored(3, buf[3], 64);
      const int64_t rows_here = std::min<int64_t>(16, M - m0);
      for (int64_t t = 0; t < nq; ++t) {
        const int64_t col = (q + t) * kW, nc = std::min<int64_t>(kW, ncols - col);
        for (int64_t r = 0; r < rows_here; ++r)
          store_bf16(y + (m0 + r) * ldy + col, add_bias(_mm512_load_ps(buf[t] + r * 16), bias ? bias + col : nullptr, nc),
                     nc);
      }
    }
  }
  // (no _tile_release: the next call reloads the configuration anyway)
}

// x [..., K] bfloat16; weight [N, K] bfloat16 (used above kMaxRows rows); packed
// [ceil(N/16), 16 ceil(K/32), 16, 2] bfloat16; bias [N] bfloat16 or none -> [..., N] bfloat16
at::Tensor dense_bf16(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& packed,
                      const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(cpu_has_bf16_dot(), "flashtree::dense_bf16 needs a CPU with AVX512-BF16");
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16, "flashtree::dense_bf16: x must be bf16 on the CPU");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16, "flashtree::dense_bf16: weight must be [N, K] bf16");
  const int64_t N = weight.size(0), K = weight.size(1), K2 = (K + 31) / 32 * 16;
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, "flashtree::dense_bf16: x has ", x.size(-1), " features, the weight ", K);
  TORCH_CHECK(packed.dim() == 4 && packed.size(0) == (N + kW - 1) / kW && packed.size(1) == K2 &&
              packed.size(2) == kW && packed.size(3) == 2 && packed.is_contiguous() &&
              packed.scalar_type() == at::kBFloat16,
              "flashtree::dense_bf16: packed weight must be [ceil(N/16), 16 ceil(K/32), 16, 2] bf16, contiguous");
  if (bias.has_value())
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == at::kBFloat16,
                "flashtree::dense_bf16: bias must be [N] bf16");
  int64_t M = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) M *= x.size(d);
  if (M > kMaxRows) return at::linear(x, weight, bias);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  at::Tensor y = at::empty(shape, x.options());  // bf16, written by the tiles (store_bf16)
  if (M == 0 || N == 0 || K == 0)
    return bias.has_value() && M > 0 ? y.copy_(bias->expand(shape)) : y.zero_();
  // x as bf16 pairs, K padded with zeros as the packed weight is (and rows to blocks of 16 for
  // AMX tiles when there are more than 16; up to 16, the tiles hold just the M rows)
  const bool amx = amx_ready();
  const int64_t Mp = amx && M > 16 ? (M + 15) / 16 * 16 : M;  // tiles past 16 rows: whole blocks of 16
  std::vector<uint32_t> xpairs(Mp * K2, 0);
  const at::Tensor x2 = x.reshape({M, K}).contiguous();
  const auto* xs = reinterpret_cast<const uint16_t*>(x2.data_ptr<at::BFloat16>());
  for (int64_t m = 0; m < M; ++m) std::memcpy(&xpairs[m * K2], xs + m * K, K * sizeof(uint16_t));
  const at::Tensor b2 = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const float* b = bias.has_value() ? b2.data_ptr<float>() : nullptr;
  const auto* w = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const int64_t P = packed.size(0), ps = K2 * 2 * kW;
  const int64_t shares = flashtree_kernels::panel_shares(P, 8, M * N * K, at::get_num_threads());
  at::parallel_for(0, shares, 1, [&](int64_t s0, int64_t s1) {
    const int64_t p0 = flashtree_kernels::share_start(P, s0, shares), p1 = flashtree_kernels::share_start(P, s1, shares);
    if (amx)
      amx_rows(xpairs.data(), K2, M, Mp, w + p0 * ps, p1 - p0, yp + p0 * kW, N, b ? b + p0 * kW : nullptr, N - p0 * kW);
    else
      rows(xpairs.data(), K2, M, w + p0 * ps, p1 - p0, K2, yp + p0 * kW, N, b ? b + p0 * kW : nullptr, N - p0 * kW);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(flashtree, m) {
  m.def("dense_bf16(Tensor x, Tensor weight, Tensor packed, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(flashtree, CPU, m) {
  m.impl("dense_bf16", &dense_bf16);
}
