// Paged attention for decode steps on the CPU: new tokens (a plain step, a chain, a draft tree or a
// prompt chunk) against a sequence's cached K/V rows read in place through its page table.
//
// The compiled graph's generic form gathers every cached row of every layer into a fresh tensor,
// builds a [B, T, S+T] mask, concatenates the new rows and hands all of it to SDPA: on the
// reference 2-core CPU that costs ~1 us per cached row per layer, so a one-token step grew from
// 1.0 ms at 100 rows of context to 4.7 ms at 1,000 (scripts/measure_forwards.py). Here nothing is
// copied: for each (sequence, kv head, new token) the scores of its group's query heads against the
// visible rows are computed straight from the cache, softmaxed, and the values summed.
//
// Rule, per query head h of kv head g = h / (H / Hkv), query t of sequence b:
//   keys = cached logical rows c < lengths[b] (physical row table[b, c / P] * P + c % P), then the
//   new rows j (not in the cache yet) with vis[b, t, j]; out = softmax(scale * q . k) @ v over them.
// The target's new rows are its new tokens; the drafter's are its fresh context rows and its block.
// Each output reads only its own sequence, in a fixed order: batch-invariant, and a tree node's
// output is bit-identical to a plain step's at the same position (its keys then are cached rows in
// the same order). A token that sees no key at all (never produced by the engine) gets zeros.
// float32 only; the caller checks.
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline float dot(const float* a, const float* b, int64_t d) {  // four independent FMA chains
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t i = 0;
  for (; i + 32 <= d; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
  }
  for (; i + 8 <= d; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < d; ++i) s += a[i] * b[i];
  return s;
}

// exp on 8 lanes: n = round(x / ln 2), r = x - n ln 2 (in two parts), exp(r) by Cephes' degree-6
// polynomial, times 2^n through the exponent bits (relative error ~1e-7; x clamped to +-88.38)
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-88.3762626647949f));
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
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// x[i] = exp(x[i] - mx) for i < m; returns their sum
inline float exp_shifted(float* x, int64_t m, float mx) {
  const __m256 mv = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float total = hsum(acc);
  for (; i < m; ++i) total += (x[i] = std::exp(x[i] - mx));
  return total;
}

inline void axpy(float w, const float* x, float* y, int64_t d) {  // y += w * x
  const __m256 wv = _mm256_set1_ps(w);
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < d; ++i) y[i] += w * x[i];
}

// One query row against its keys: key i is keys[i] (D floats), value i is vals[i]. Scores go to
// sbuf [m]; out [D] = softmax(scale * q . k) @ v. DD = D known at compile time (q and the output
// then live in registers across the keys), or 0 for any D.
template <int DD>
void attend_one(const float* q, const float* const* keys, const float* const* vals, int64_t m, int64_t D,
                float scale, float* sbuf, float* out) {
  constexpr int NV = DD / 8;
  if (m == 0) {
    for (int64_t d = 0; d < D; ++d) out[d] = 0.f;
    return;
  }
  float mx = -std::numeric_limits<float>::infinity();
  if constexpr (DD > 0) {
    __m256 qv[NV];
    for (int v = 0; v < NV; ++v) qv[v] = _mm256_loadu_ps(q + 8 * v);
    for (int64_t i = 0; i < m; ++i) {
      __m256 a0 = _mm256_mul_ps(qv[0], _mm256_loadu_ps(keys[i])), a1 = _mm256_mul_ps(qv[1], _mm256_loadu_ps(keys[i] + 8));
      for (int v = 2; v < NV; v += 2) {
        a0 = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(keys[i] + 8 * v), a0);
        a1 = _mm256_fmadd_ps(qv[v + 1], _mm256_loadu_ps(keys[i] + 8 * v + 8), a1);
      }
      sbuf[i] = scale * hsum(_mm256_add_ps(a0, a1));
      mx = std::max(mx, sbuf[i]);
    }
  } else {
    for (int64_t i = 0; i < m; ++i) {
      sbuf[i] = scale * dot(q, keys[i], D);
      mx = std::max(mx, sbuf[i]);
    }
  }
  const float inv = 1.f / exp_shifted(sbuf, m, mx);
  if constexpr (DD > 0) {
    __m256 acc[NV];
    for (int v = 0; v < NV; ++v) acc[v] = _mm256_setzero_ps();
    for (int64_t i = 0; i < m; ++i) {
      const __m256 w = _mm256_set1_ps(sbuf[i] * inv);
      for (int v = 0; v < NV; ++v) acc[v] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vals[i] + 8 * v), acc[v]);
    }
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(out + 8 * v, acc[v]);
  } else {
    for (int64_t d = 0; d < D; ++d) out[d] = 0.f;
    for (int64_t i = 0; i < m; ++i) axpy(sbuf[i] * inv, vals[i], out, D);
  }
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                           const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& table,
                           const at::Tensor& lengths, const at::Tensor& vis, int64_t page_size, double scale) {
  // q [B, T, H, D]; k_new, v_new [B, N, Hkv, D]; k_cache, v_cache [rows, Hkv, D] (one layer);
  // table [B, pages] int64; lengths [B] int64; vis [B, T, N] bool -> [B, T, H, D]
  TORCH_CHECK(q.dim() == 4 && k_new.dim() == 4 && v_new.dim() == 4 && k_cache.dim() == 3 && v_cache.dim() == 3,
              "paged_attention: q, k_new, v_new must be 4-D and the caches 3-D");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_new.scalar_type() == at::kFloat && v_new.scalar_type() == at::kFloat &&
              k_cache.scalar_type() == at::kFloat && v_cache.scalar_type() == at::kFloat,
              "paged_attention: float32 tensors only");
  TORCH_CHECK(table.scalar_type() == at::kLong && lengths.scalar_type() == at::kLong && vis.scalar_type() == at::kBool,
              "paged_attention: table and lengths must be int64, vis bool");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t N = k_new.size(1), Hkv = k_new.size(2), rows = k_cache.size(0), pages = table.size(1);
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, "paged_attention: query heads must be a multiple of kv heads");
  TORCH_CHECK(k_new.size(0) == B && k_new.size(3) == D && v_new.sizes() == k_new.sizes() &&
              k_cache.size(1) == Hkv && k_cache.size(2) == D && v_cache.sizes() == k_cache.sizes() &&
              table.size(0) == B && lengths.size(0) == B && vis.size(0) == B && vis.size(1) == T && vis.size(2) == N,
              "paged_attention: inconsistent shapes");
  TORCH_CHECK(page_size > 0, "paged_attention: page_size must be positive");
  const at::Tensor qc = q.contiguous(), kn = k_new.contiguous(), vn = v_new.contiguous(), kc = k_cache.contiguous(),
                   vc = v_cache.contiguous(), tb = table.contiguous(), ln = lengths.contiguous(), vs = vis.contiguous();
  at::Tensor out = at::empty({B, T, H, D}, q.options());
  const float *Q = qc.data_ptr<float>(), *KN = kn.data_ptr<float>(), *VN = vn.data_ptr<float>();
  const float *KC = kc.data_ptr<float>(), *VC = vc.data_ptr<float>();
  const int64_t *TB = tb.data_ptr<int64_t>(), *LN = ln.data_ptr<int64_t>();
  const bool* VS = vs.data_ptr<bool>();
  float* O = out.data_ptr<float>();
  const int64_t G = H / Hkv;
  const float sc = static_cast<float>(scale);
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(LN[b] >= 0 && LN[b] <= pages * page_size, "paged_attention: a length exceeds its page table");

  // one item = (b, g, t): the G query heads of kv head g for new token t of sequence b. Per query
  // the keys, their order and every operation on them are the same whatever else the call holds
  // (a tree node == the plain step at its position: its ancestors are then cached rows, in order).
  at::parallel_for(0, B * Hkv * T, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> sbuf;
    std::vector<const float*> keys, vals;
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t t = item % T, g = (item / T) % Hkv, b = item / (T * Hkv), n = LN[b];
      keys.clear(), vals.clear();
      for (int64_t c0 = 0; c0 < n; c0 += page_size) {  // cached rows, page by page
        const int64_t row0 = TB[b * pages + c0 / page_size] * page_size, cnt = std::min(page_size, n - c0);
        TORCH_CHECK(row0 >= 0 && row0 + cnt <= rows, "paged_attention: a page table entry is outside the cache");
        for (int64_t r = row0; r < row0 + cnt; ++r) {
          keys.push_back(KC + (r * Hkv + g) * D);
          vals.push_back(VC + (r * Hkv + g) * D);
        }
      }
      for (int64_t j = 0; j < N; ++j) {  // then the new rows it sees
        if (!VS[(b * T + t) * N + j]) continue;
        keys.push_back(KN + ((b * N + j) * Hkv + g) * D);
        vals.push_back(VN + ((b * N + j) * Hkv + g) * D);
      }
      const int64_t m = static_cast<int64_t>(keys.size());
      sbuf.resize(m);
      for (int64_t h = 0; h < G; ++h) {
        const float* qh = Q + ((b * T + t) * H + g * G + h) * D;
        float* oh = O + ((b * T + t) * H + g * G + h) * D;
        if (D == 64) attend_one<64>(qh, keys.data(), vals.data(), m, D, sc, sbuf.data(), oh);
        else if (D == 128) attend_one<128>(qh, keys.data(), vals.data(), m, D, sc, sbuf.data(), oh);
        else attend_one<0>(qh, keys.data(), vals.data(), m, D, sc, sbuf.data(), oh);
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(flashtree, m) {
  m.def("paged_attention(Tensor q, Tensor k_new, Tensor v_new, Tensor k_cache, Tensor v_cache, Tensor table, "
        "Tensor lengths, Tensor vis, int page_size, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(flashtree, CPU, m) {
  m.impl("paged_attention", &paged_attention);
}
