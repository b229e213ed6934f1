// flashtree::qdense_panels — y = x @ W^T + b for a weight in GGUF blocks of 32 (Q8_0, Q4_0, Q4_1;
// Q4_K as its sub-blocks of 32 with float32 scales)
// laid out in panels of 16 rows, by AMX-INT8 tiles.
//
// Why: cpu_quant.cpp's vector kernels multiply a block's quants once per row of x, so a verify of
// T rows costs T times the integer work of a step (Qwen3-1.7B-shaped Q4_0, vpdpbusd: 8 rows 1.99x
// one row; maddubs 2.68x; benchmarks/prefetch_2026-12-07). One tile multiply-add here takes up to
// 16 rows of x against 16 weight rows and a block (16 x 16 x 32), so the rows of a verify ride on
// the block's one unpacking and one load.
//
// Layout (quant.py's `to_panels`, once at load): weight rows in panels of 16 (zero rows past N),
// each panel's blocks in turn; a panel's block is the tile's B operand in AMX's VNNI order, row r
// (of 8) holding weights 4r..4r+3 of each of the 16 weight rows, 64 bytes a row: q8 as int8 (512
// bytes), q4 as nibbles (256 bytes: B rows 2i and 2i+1 in the low and high nibbles of bytes
// 64i..64i+63). d, m [P, nb, 16] float16 (float32 for a K-quant): the block scales (and Q4_1 offsets) of a panel's 16
// rows, so one 32-byte load gives a block's 16 scales.
//
// x is quantized per row in blocks of 32 as for the vector kernels (`quantize_row`), then
//   y[t, n] = sum over b in order of ( float(isum[t,n,b]) (d[n,b] xd[t,b])  (+ m[n,b] xs[t,b]) )  + bias[n]
// each block's integer sum exact (tdpbssd / tdpbsud: int32, |sum| <= 32 * 128 * 127) and the float
// sums in 16 lanes (one per weight row), one multiply-add (two for q4) a block in block order: every
// output is the same sequence of operations whatever the number of rows, the tile or the thread,
// so a row's result never depends on which rows share the call. The order differs from the vector
// kernels' (by eights), so one process takes one of the two for every call (quant.py's rule).
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>

#include "cpu_kernels.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int kB = flashtree_kernels::kBlock;
constexpr int kP = 16;  // weight rows a panel (a tile's 16 columns)

// Bytes ahead of a panel's block at which its quants are prefetched: tile loads are not prefetched
// from memory as vector loads are.
constexpr int64_t kAhead = 2048;

#define FT_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))

// AMX-INT8 on this CPU, with the OS's permission for this process's tile data, unless
// FLASHTREE_ISA names a lower path.
bool amx_int8_ready() {
  static const bool ok = [] {
    if (!flashtree_kernels::isa_allows("amx")) return false;
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8") ||
        !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl"))
      return false;
    return flashtree_kernels::tile_data_granted();
  }();
  return ok;
}

// Tiles: 0 and 3 a block's sums [mt, 16] int32, 1 and 4 its x rows [mt, 32] int8, 2 and 5 its
// weights [8, 64] (two blocks in flight).
FT_AMX void configure(int mt) {
  flashtree_kernels::TileConfig cfg;
  for (int t : {0, 3}) cfg.rows[t] = mt, cfg.colsb[t] = 64;
  for (int t : {1, 4}) cfg.rows[t] = mt, cfg.colsb[t] = 32;
  for (int t : {2, 5}) cfg.rows[t] = 8, cfg.colsb[t] = 64;
  asm volatile("" : : "r"(&cfg) : "memory");  // GCC 12 drops the stores above otherwise (ldtilecfg reads 64 bytes)
  _tile_loadconfig(&cfg);
}

// A q4 panel block's 256 bytes as the B operand's 512 (nibbles to bytes 0..15).
FT_AMX inline void unpack_q4(const uint8_t* src, uint8_t* dst) {
  const __m512i lo = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512i z = _mm512_loadu_si512(src + 64 * i);
    _mm512_store_si512(dst + 128 * i, _mm512_and_si512(z, lo));
    _mm512_store_si512(dst + 128 * i + 64, _mm512_and_si512(_mm512_srli_epi16(z, 4), lo));
  }
}

// A panel block's 16 scales as float32: float16 bits (the file's) or float32 (a K-quant's sub-blocks).
FT_AMX inline __m512 scales16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
FT_AMX inline __m512 scales16(const float* p) { return _mm512_loadu_ps(p); }

// acc[t] (16 lanes: the panel's rows) += block b's sums c [mt, 16] by its scales, in the fixed order.
template <bool Q4, typename Sc>
FT_AMX inline void add_block(__m512* acc, const int32_t* c, int mt, const Sc* d, const Sc* m,
                             const float* xd, const float* xs, int64_t nbp, int64_t b) {
  const __m512 dv = scales16(d);
  __m512 mv = dv;
  if constexpr (Q4)
    mv = m ? scales16(m) : _mm512_mul_ps(dv, _mm512_set1_ps(-8.0f));  // Q4_0: -8 d (exact)
#pragma GCC unroll 16
  for (int t = 0; t < kP; ++t) {
    if (t >= mt) break;
    const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(c + t * kP));
    acc[t] = _mm512_fmadd_ps(s, _mm512_mul_ps(dv, _mm512_set1_ps(xd[t * nbp + b])), acc[t]);
    if constexpr (Q4) acc[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xs[t * nbp + b]), acc[t]);
  }
}

// One thread's panels [p0, p1) for x rows [t0, t0 + mt) (mt <= 16; the tiles configured for mt).
template <bool Q4, typename Sc>
FT_AMX void panels(const int8_t* xq, const float* xd, const float* xs, int mt, int64_t K, int64_t nbp,
                   const uint8_t* qs, const Sc* d, const Sc* m, int64_t p0, int64_t p1, float* y,
                   int64_t N, const float* bias, bool prefetch) {
  constexpr int64_t QB = Q4 ? 256 : 512;  // bytes of a panel block's quants
  const int64_t nb = K / kB;
  alignas(64) uint8_t wbuf[2][2][512];  // q4: the next two blocks unpacked while the tiles take these two
  alignas(64) int32_t cbuf[2][kP * kP];
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* qp = qs + p * nb * QB;
    const Sc* dp = d + p * nb * kP;
    const Sc* mp = m ? m + p * nb * kP : nullptr;
    __m512 acc[kP];
#pragma GCC unroll 16
    for (int t = 0; t < kP; ++t) acc[t] = _mm512_setzero_ps();
    int64_t b = 0;
    if constexpr (Q4)
      if (nb >= 2) unpack_q4(qp, wbuf[0][0]), unpack_q4(qp + QB, wbuf[0][1]);
    for (; b + 2 <= nb; b += 2) {
      if (prefetch)
        for (int64_t l = 0; l < 2 * QB; l += 64) _mm_prefetch(reinterpret_cast<const char*>(qp + b * QB + kAhead + l), _MM_HINT_T0);
      if constexpr (Q4) {
        uint8_t(*now)[512] = wbuf[(b / 2) & 1];
        _tile_loadd(2, now[0], 64);
        _tile_loadd(5, now[1], 64);
        if (b + 4 <= nb) {
          uint8_t(*next)[512] = wbuf[(b / 2 + 1) & 1];
          unpack_q4(qp + (b + 2) * QB, next[0]);
          unpack_q4(qp + (b + 3) * QB, next[1]);
        }
      } else {
        _tile_loadd(2, qp + b * QB, 64);
        _tile_loadd(5, qp + (b + 1) * QB, 64);
      }
      _tile_loadd(1, xq + b * kB, K);
      _tile_loadd(4, xq + (b + 1) * kB, K);
      _tile_zero(0);
      _tile_zero(3);
      if constexpr (Q4) {
        _tile_dpbsud(0, 1, 2);
        _tile_dpbsud(3, 4, 5);
      } else {
        _tile_dpbssd(0, 1, 2);
        _tile_dpbssd(3, 4, 5);
      }
      _tile_stored(0, cbuf[0], 64);
      _tile_stored(3, cbuf[1], 64);
      add_block<Q4, Sc>(acc, cbuf[0], mt, dp + b * kP, mp ? mp + b * kP : nullptr, xd, xs, nbp, b);
      add_block<Q4, Sc>(acc, cbuf[1], mt, dp + (b + 1) * kP, mp ? mp + (b + 1) * kP : nullptr, xd, xs, nbp, b + 1);
    }
    if (b < nb) {  // an odd block count's last
      if constexpr (Q4) {
        unpack_q4(qp + b * QB, wbuf[0][0]);
        _tile_loadd(2, wbuf[0][0], 64);
      } else {
        _tile_loadd(2, qp + b * QB, 64);
      }
      _tile_loadd(1, xq + b * kB, K);
      _tile_zero(0);
      if constexpr (Q4) _tile_dpbsud(0, 1, 2); else _tile_dpbssd(0, 1, 2);
      _tile_stored(0, cbuf[0], 64);
      add_block<Q4, Sc>(acc, cbuf[0], mt, dp + b * kP, mp ? mp + b * kP : nullptr, xd, xs, nbp, b);
    }
    const int64_t n0 = p * kP, nc = std::min<int64_t>(kP, N - n0);
    const __mmask16 keep = static_cast<__mmask16>((1u << nc) - 1);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(keep, bias + n0) : _mm512_setzero_ps();
    for (int t = 0; t < mt; ++t) _mm512_mask_storeu_ps(y + t * N + n0, keep, bias ? _mm512_add_ps(acc[t], bv) : acc[t]);
  }
}

// x [..., K] float32, bfloat16 or float64 (quantized from float32 all the same); qs [P, K/32, 512]
// int8 (q8) or [P, K/32, 256] uint8 (q4); d, m [P, K/32, 16] float16 or float32 (m: Q4_1 only); bias [N] or
// none; n = N <= 16 P -> [..., N] in x's dtype.
at::Tensor qdense_panels(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, const std::optional<at::Tensor>& m,
                         const std::optional<at::Tensor>& bias, int64_t n) {
  TORCH_CHECK(amx_int8_ready(), "flashtree::qdense_panels needs AMX-INT8 (and the OS's grant of its tile state)");
  const auto dt = x.scalar_type();
  TORCH_CHECK(x.device().is_cpu() && (dt == at::kFloat || dt == at::kBFloat16 || dt == at::kDouble),
              "flashtree::qdense_panels: x must be float32, bfloat16 or float64 on the CPU");
  const bool q4 = qs.scalar_type() == at::kByte;
  TORCH_CHECK(q4 || qs.scalar_type() == at::kChar, "flashtree::qdense_panels: qs must be int8 (q8) or uint8 (q4)");
  TORCH_CHECK(qs.dim() == 3 && qs.size(2) == (q4 ? 256 : 512) && qs.is_contiguous(),
              "flashtree::qdense_panels: qs must be [P, K/32, 256 (q4) or 512 (q8)], contiguous");
  const int64_t P = qs.size(0), nb = qs.size(1), K = nb * kB, N = n;
  TORCH_CHECK(N > 16 * (P - 1) && N <= 16 * P, "flashtree::qdense_panels: n must be within the last panel");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, "flashtree::qdense_panels: x has ", x.size(-1), " features, the weight ", K);
  const bool f32 = d.scalar_type() == at::kFloat;
  TORCH_CHECK(d.dim() == 3 && d.size(0) == P && d.size(1) == nb && d.size(2) == kP && d.is_contiguous() &&
                  (d.scalar_type() == at::kHalf || f32),
              "flashtree::qdense_panels: d must be [P, K/32, 16] float16 or float32, contiguous");
  TORCH_CHECK(q4 || !m.has_value(), "flashtree::qdense_panels: m goes with q4 weights only");
  if (m.has_value())
    TORCH_CHECK(m->sizes() == d.sizes() && m->is_contiguous() && m->scalar_type() == d.scalar_type(),
                "flashtree::qdense_panels: m must be shaped and typed as d");
  if (bias.has_value())
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N, "flashtree::qdense_panels: bias must be [N]");
  int64_t M = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) M *= x.size(i);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  at::Tensor y = at::empty(shape, x.options().dtype(at::kFloat));
  if (M == 0 || N == 0) return y.to(dt);
  const at::Tensor x2 = x.reshape({M, K}).to(at::kFloat).contiguous();
  const at::Tensor b2 = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const int64_t nbp = nb;
  std::vector<int8_t> xq(M * K);
  std::vector<float> xd(M * nbp), xs(M * nbp);
  const float* xp = x2.data_ptr<float>();
  for (int64_t i = 0; i < M; ++i) flashtree_kernels::quantize_row(xp + i * K, K, &xq[i * K], &xd[i * nbp], &xs[i * nbp], nbp);
  const float* bp = bias.has_value() ? b2.data_ptr<float>() : nullptr;
  const uint8_t* q = reinterpret_cast<const uint8_t*>(qs.data_ptr());
  float* yp = y.data_ptr<float>();
  const int64_t shares = flashtree_kernels::panel_shares(P, 8, M * N * K, at::get_num_threads());
  at::parallel_for(0, shares, 1, [&](int64_t s0, int64_t s1) {
    const int64_t p0 = flashtree_kernels::share_start(P, s0, shares), p1 = flashtree_kernels::share_start(P, s1, shares);
    for (int64_t t0 = 0; t0 < M; t0 += kP) {  // later row blocks read the panels from the cache
      const int mt = static_cast<int>(std::min<int64_t>(kP, M - t0));
      configure(mt);
      const int8_t* xt = xq.data() + t0 * K;
      const float *dt0 = xd.data() + t0 * nbp, *st0 = xs.data() + t0 * nbp;
      auto run = [&](const auto* dp) {  // the scales' type: float32 (a K-quant's) or float16 bits
        using Sc = std::remove_cv_t<std::remove_pointer_t<decltype(dp)>>;
        const Sc* mp = m.has_value() ? static_cast<const Sc*>(m->data_ptr()) : nullptr;
        if (q4)
          panels<true, Sc>(xt, dt0, st0, mt, K, nbp, q, dp, mp, p0, p1, yp + t0 * N, N, bp, t0 == 0);
        else
          panels<false, Sc>(xt, dt0, st0, mt, K, nbp, q, dp, mp, p0, p1, yp + t0 * N, N, bp, t0 == 0);
      };
      if (f32) run(static_cast<const float*>(d.data_ptr()));
      else run(static_cast<const uint16_t*>(d.data_ptr()));
    }
  });
  return dt == at::kFloat ? y : y.to(dt);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(flashtree, m) {
  m.def("qdense_panels(Tensor x, Tensor qs, Tensor d, Tensor? m, Tensor? bias, int n) -> Tensor");
  m.def("qdense_panels_ready() -> bool", [] { return amx_int8_ready(); });
}

TORCH_LIBRARY_IMPL(flashtree, CPU, m) {
  m.impl("qdense_panels", &qdense_panels);
}
