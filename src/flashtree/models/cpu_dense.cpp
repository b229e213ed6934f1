// flashtree::dense — y = x @ W^T + b on the CPU for the few rows decoding multiplies (AVX2 + FMA).
//
// Why: a decode step multiplies 1..~100 rows by each weight. MKL's sgemm is tuned for big
// products; on the reference CPU (Zen 3, AVX2) the bundled target's 17 projections took
// 1.97-3.69 ms at 1-9 rows through it, against 0.43-1.08 ms here
// (benchmarks/real_model_2026-12-03/measure_projections.py).
//
// How: the weight [N, K] is packed once into panels of 16 output columns, k-major:
// packed[p, k, c] = W[16p + c, k] (zero-padded past N), so one k step of a panel is one 64-byte
// load. A tile of MR rows x P panels keeps its 2*MR*P eight-float sums in registers for the
// whole k loop: each weight vector loaded is used by MR rows (the weight is read once per 6
// rows, not once per row), and 8-12 independent sums hide the FMA latency. Threads split the
// panels (torch's OpenMP pool, so no second pool fights it).
//
// Every output is the same sequential sum, fma(x[m,k], W[n,k], acc) for k = 0..K-1 from 0, then
// + b[n], whatever the tile, the thread or the number of rows: a row's result does not depend on
// which other rows share the call (batch-invariant), unlike MKL's.
//
// bfloat16: the weight is packed as bf16 (half the bytes a decode step streams) and widened to
// float32 in registers (a bf16 is the top half of a float32: zero-extend, shift left 16); x is
// widened once, the sums are the same float32 sums, and y is rounded to bf16 at the end, as
// at::linear rounds its float32 accumulators. This path serves CPUs without AVX512-BF16; with
// it, bf16 goes to cpu_dense_bf16.cpp.
//
// Above kMaxRows rows (prefill) the call goes to at::linear, whose blocked GEMM is made for it.
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <immintrin.h>

#include "cpu_kernels.h"

#include <algorithm>
#include <vector>

namespace {

constexpr int kW = 16;            // panel width: two 8-float vectors
// More rows: at::linear (matches MAX_ROWS in flashtree/models/cpu_dense.py). On the reference
// Zen 3 the kernel was still 1.1x MKL at 256 rows; on an AVX-512 CPU MKL may win sooner (unmeasured).
constexpr int64_t kMaxRows = 256;

// 8 weights of a panel row as float32: a float32 load, or bf16 widened (bits << 16).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// How far ahead of its k step a tile prefetches each panel (64 B a k step in float32): a tile
// of few panels is one or two sequential streams, which the hardware prefetcher alone kept
// below the bandwidth a one-row step reaches with four.
constexpr int64_t kAhead = 24;

// y[MR, <=16P] = x[MR, K] @ panels[P]; ncols = valid columns left from this tile's first.
template <int MR, int P, typename WT>
inline void tile(const float* __restrict x, int64_t ldx, const WT* __restrict wp, int64_t K,
                 float* __restrict y, int64_t ldy, const float* __restrict bias, int64_t ncols) {
  __m256 acc[MR][2 * P];
#pragma GCC unroll 32
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 32
    for (int j = 0; j < 2 * P; ++j) acc[m][j] = _mm256_setzero_ps();
  const int64_t ps = K * kW;  // floats per panel
  for (int64_t k = 0; k < K; ++k) {
    __m256 w[2 * P];
#pragma GCC unroll 32
    for (int p = 0; p < P; ++p) {
      _mm_prefetch(reinterpret_cast<const char*>(wp + p * ps + (k + kAhead) * kW), _MM_HINT_T0);
      w[2 * p] = load8(wp + p * ps + k * kW);
      w[2 * p + 1] = load8(wp + p * ps + k * kW + 8);
    }
#pragma GCC unroll 32
    for (int m = 0; m < MR; ++m) {
      const __m256 xb = _mm256_broadcast_ss(x + m * ldx + k);
#pragma GCC unroll 32
      for (int j = 0; j < 2 * P; ++j) acc[m][j] = _mm256_fmadd_ps(xb, w[j], acc[m][j]);
    }
  }
  // constant indices only (fully unrolled), so the sums never leave registers inside the loop
  alignas(32) float buf[MR][kW * P];
#pragma GCC unroll 32
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 32
    for (int j = 0; j < 2 * P; ++j) _mm256_store_ps(&buf[m][j * 8], acc[m][j]);
  const int64_t nc = std::min<int64_t>(ncols, kW * P);
  for (int m = 0; m < MR; ++m) {
    float* ym = y + m * ldy;
    if (bias)
      for (int64_t c = 0; c < nc; ++c) ym[c] = buf[m][c] + bias[c];
    else
      for (int64_t c = 0; c < nc; ++c) ym[c] = buf[m][c];
  }
}

// MR rows over np panels, P panels per tile: 1x4, 2x2, then 3..6 rows x 1 (8..12 sums each,
// within the 16 vector registers with the weight vectors and the broadcast).
template <int MR, typename WT>
inline void tiles(const float* x, int64_t ldx, const WT* wp, int64_t np, int64_t K, float* y,
                  int64_t ldy, const float* bias, int64_t ncols) {
  constexpr int P = MR == 1 ? 4 : (MR == 2 ? 2 : 1);
  int64_t q = 0;
  for (; q + P <= np; q += P)
    tile<MR, P, WT>(x, ldx, wp + q * K * kW, K, y + q * kW, ldy, bias ? bias + q * kW : nullptr, ncols - q * kW);
  for (; q < np; ++q)
    tile<MR, 1, WT>(x, ldx, wp + q * K * kW, K, y + q * kW, ldy, bias ? bias + q * kW : nullptr, ncols - q * kW);
}

// Every row over np panels: tiles of 6 rows, then one of the remaining 1..5.
template <typename WT>
inline void row_tiles(const float* x, int64_t ldx, int64_t M, const WT* wp, int64_t np, int64_t K, float* y,
                      int64_t ldy, const float* bias, int64_t ncols) {
  int64_t m = 0;
  for (; m + 6 <= M; m += 6) tiles<6, WT>(x + m * ldx, ldx, wp, np, K, y + m * ldy, ldy, bias, ncols);
  const float* xm = x + m * ldx;
  float* ym = y + m * ldy;
  switch (M - m) {
    case 5: tiles<5, WT>(xm, ldx, wp, np, K, ym, ldy, bias, ncols); break;
    case 4: tiles<4, WT>(xm, ldx, wp, np, K, ym, ldy, bias, ncols); break;
    case 3: tiles<3, WT>(xm, ldx, wp, np, K, ym, ldy, bias, ncols); break;
    case 2: tiles<2, WT>(xm, ldx, wp, np, K, ym, ldy, bias, ncols); break;
    case 1: tiles<1, WT>(xm, ldx, wp, np, K, ym, ldy, bias, ncols); break;
    default: break;
  }
}

// Panels are taken in groups of about kGroupBytes (whole 1x4 tiles), and every row tile passes
// over a group before the next: the group comes from memory once and the later row tiles read
// it from L2, so a verify of M rows streams the weights once, not once per 6 rows. (A thread's
// whole share, which the row tiles passed over before, is megabytes: SmolLM2's MLP shares are
// 1.7-3.5 MB in float32 and its head's 57 MB, past any L2.) A tile's sums are the same whatever
// the grouping.
constexpr int64_t kGroupBytes = 128 * 1024;

template <typename WT>
inline void rows(const float* x, int64_t ldx, int64_t M, const WT* wp, int64_t np, int64_t K, float* y,
                 int64_t ldy, const float* bias, int64_t ncols) {
  const int64_t per = std::max<int64_t>(4, kGroupBytes / (K * kW * int64_t{sizeof(WT)}) / 4 * 4);
  for (int64_t g = 0; g < np; g += per)
    row_tiles(x, ldx, M, wp + g * K * kW, std::min(per, np - g), K, y + g * kW, ldy,
              bias ? bias + g * kW : nullptr, ncols - g * kW);
}

// x [..., K] and weight [N, K] (used above kMaxRows rows) float32 or both bfloat16; packed
// [ceil(N/16), K, 16] in the weight's dtype; bias [N] in it or none -> [..., N] in x's dtype
at::Tensor dense(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& packed,
                 const std::optional<at::Tensor>& bias) {
  const auto dt = x.scalar_type();
  TORCH_CHECK(x.device().is_cpu() && (dt == at::kFloat || dt == at::kBFloat16),
              "flashtree::dense: x must be float32 or bfloat16 on the CPU");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == dt, "flashtree::dense: weight must be [N, K] in x's dtype");
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, "flashtree::dense: x has ", x.size(-1), " features, the weight ", K);
  TORCH_CHECK(packed.dim() == 3 && packed.size(0) == (N + kW - 1) / kW && packed.size(1) == K &&
              packed.size(2) == kW && packed.is_contiguous() && packed.scalar_type() == dt,
              "flashtree::dense: packed weight must be [ceil(N/16), K, 16] in x's dtype, contiguous");
  if (bias.has_value())
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == dt,
                "flashtree::dense: bias must be [N] in x's dtype");
  int64_t M = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) M *= x.size(d);
  if (M > kMaxRows) return at::linear(x, weight, bias);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  at::Tensor y = at::empty(shape, x.options().dtype(at::kFloat));
  if (M == 0 || N == 0) return y.to(dt);
  if (K == 0) return (bias.has_value() ? y.copy_(bias->expand(shape)) : y.zero_()).to(dt);
  const at::Tensor x2 = x.reshape({M, K}).to(at::kFloat).contiguous();
  const at::Tensor b2 = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const float* xp = x2.data_ptr<float>();
  const float* b = bias.has_value() ? b2.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t P = packed.size(0);
  const int64_t shares = flashtree_kernels::panel_shares(P, 4, M * N * K, at::get_num_threads());
  auto run = [&](auto* w) {
    at::parallel_for(0, shares, 1, [&](int64_t s0, int64_t s1) {
      const int64_t p0 = flashtree_kernels::share_start(P, s0, shares), p1 = flashtree_kernels::share_start(P, s1, shares);
      rows(xp, K, M, w + p0 * K * kW, p1 - p0, K, yp + p0 * kW, N, b ? b + p0 * kW : nullptr, N - p0 * kW);
    });
  };
  if (dt == at::kFloat) {
    run(packed.data_ptr<float>());
    return y;
  }
  run(reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>()));
  return y.to(at::kBFloat16);
}

}  // namespace

TORCH_LIBRARY(flashtree, m) {
  m.def("dense(Tensor x, Tensor weight, Tensor packed, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(flashtree, CPU, m) {
  m.impl("dense", &dense);
}
