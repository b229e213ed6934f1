// What the CPU kernels share between their files (one library, built together by cpu_dense.py).
#pragma once
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace flashtree_kernels {

// The k largest values of x[0, V) into bv[0, k), descending, their indices into bi (the lower
// index first among equal values); NaN is never selected (short rows pad with -inf at index -1).
// In cpu_topk.cpp.
void topk_row(const float* x, int64_t V, int64_t k, float* bv, int64_t* bi);

// How many contiguous shares the threads split a product's P panels into: one per G panels at
// most and no more than the threads; one for a tiny product (below 2^16 multiply-adds), where
// waking a thread costs more than it saves. Share t is panels [P t / n, P (t + 1) / n): the shares
// differ by one panel at most (SmolLM2's 36-panel bf16 projections split 18 / 18, where whole
// groups of 8 panels gave one thread 24 and the other 12). Which thread takes a panel never
// changes its sums.
inline int64_t panel_shares(int64_t P, int64_t G, int64_t macs, int64_t threads) {
  if (macs < (int64_t{1} << 16)) return 1;
  return std::clamp<int64_t>((P + G - 1) / G, 1, threads);
}

// Whether FLASHTREE_ISA (validated by cpu.py; unset or "auto" = the CPU's own path) allows the
// instructions of `path`, one of avx2 < avx512 < avx512_bf16 < amx: a forced lower path turns
// the higher kernels off, as the Python side's choice of layouts and dtypes does.
inline bool isa_allows(const char* path) {
  static const char* const kPaths[] = {"avx2", "avx512", "avx512_bf16", "amx"};
  auto rank = [](const char* p) {
    for (int i = 0; i < 4; ++i)
      if (std::strcmp(p, kPaths[i]) == 0) return i;
    return 4;  // unset, "auto" or anything else: no cap
  };
  static const int cap = [&] {
    const char* v = std::getenv("FLASHTREE_ISA");
    return v == nullptr ? 4 : rank(v);
  }();
  return rank(path) <= cap;
}

// The first panel of share t of n (share_start(P, n, n) = P: the end of the last).
inline int64_t share_start(int64_t P, int64_t t, int64_t n) { return P * t / n; }

// exp(x) on 8 lanes (Cephes expf): 2^n e^r with n = round(x log2 e), r = x - n ln 2 (in two
// parts), e^r by a degree-6 polynomial (relative error ~1e-7). Below -87.34, where float32's
// normal range ends, it is 0 (-inf included); x is clamped at 88.38 above. NaN lanes are not
// handled: callers pass none.
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3365447504f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.3762626647949f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

// The AMX tile configuration (palette 1), as ldtilecfg reads it (cpu_dense_bf16.cpp, cpu_quant_amx.cpp).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Whether Linux grants this process AMX's tile data (each kernel asks once and keeps the answer).
inline bool tile_data_granted() {
  constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
}

constexpr int kBlock = 32;  // weights per GGUF block (cpu_quant.cpp, cpu_quant_amx.cpp)

// The q8 row quantization of x (the blocks kernels'): for each block of 32, amax = max |x|, xd = amax / 127,
// xq = round-half-even(x * (127 / amax)) (0 where amax is 0), xs = xd * sum(xq).
inline void quantize_row(const float* x, int64_t K, int8_t* xq, float* xd, float* xs, int64_t nbp) {
  const int64_t nb = K / kBlock;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + b * kBlock + 8 * i);
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
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + b * kBlock), p);
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    xd[b] = d;
    xs[b] = d * static_cast<float>(_mm_cvtsi128_si32(t));
  }
  for (int64_t b = nb; b < nbp; ++b) xd[b] = xs[b] = 0.0f;
}

}  // namespace flashtree_kernels
