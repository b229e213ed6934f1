// Paged attention for decode steps on the CPU: new tokens (a plain step, a chain, a draft tree or a
// prompt chunk) against a sequence's cached K/V rows read in place through its page table.
//
// The compiled graph's generic form gathers every cached row of every layer into a fresh tensor,
// builds a [B, T, S+T] mask, concatenates the new rows and hands all of it to SDPA: on the
// reference 2-core CPU that costs ~1 us per cached row per layer, so a one-token step grew from
// 1.0 ms at 100 rows of context to 4.7 ms at 1,000 (scripts/measure_forwards.py). Here nothing is
// copied: for each (sequence, kv head) the query heads of all its new tokens go through its cached
// rows together, a block of rows at a time (each K and V block read from memory once for all of
// them, not once per query), then each query through the new rows it sees; softmax; values summed.
//
// Rule, per query head h of kv head g = h / (H / Hkv), query t of sequence b:
//   keys = cached logical rows c < lengths[b] (physical row table[b, c / P] * P + c % P), then the
//   new rows j (not in the cache yet) with vis[b, t, j]; out = softmax(scale * q . k) @ v over them.
// The target's new rows are its new tokens; the drafter's are its fresh context rows and its block.
// Each output reads only its own sequence, in a fixed order: batch-invariant, and a tree node's
// output is bit-identical to a plain step's at the same position (its keys then are cached rows in
// the same order). A token that sees no key at all (never produced by the engine) gets zeros.
// Queries and outputs are float32; K/V (cache and new rows alike) are float32 or bfloat16, widened
// exactly to float32 as they are loaded, so a bf16 cache gives the bits a float32 cache holding the
// same values would (and reads half the bytes).
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using bf16 = uint16_t;  // bfloat16's bits (at::BFloat16's storage): the high half of a float32

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {  // 8 bfloat16 -> 8 float32, exact
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float widen(float x) { return x; }
inline float widen(bf16 x) {
  const uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

template <typename E>
inline float dot(const float* a, const E* b, int64_t d) {  // four independent FMA chains
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t i = 0;
  for (; i + 32 <= d; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load8(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), load8(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), load8(b + i + 24), acc3);
  }
  for (; i + 8 <= d; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), acc0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < d; ++i) s += a[i] * widen(b[i]);
  return s;
}

using flashtree_kernels::exp8;  // cpu_kernels.h

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

template <typename E>
inline void axpy(float w, const E* x, float* y, int64_t d) {  // y += w * x
  const __m256 wv = _mm256_set1_ps(w);
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, load8(x + i), _mm256_loadu_ps(y + i)));
  for (; i < d; ++i) y[i] += w * widen(x[i]);
}

// The sums of four vectors' lanes, as lanes 0..3: for each, ((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7)) —
// one fixed order per vector, whichever other vectors share the call.
inline __m128 hsum4(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Scores of one query against m keys, for D = DD (q lives in registers): s[i] = scale * q . keys[i],
// four keys' dot products reduced together by hsum4 (zero vectors fill a last group of 1..3). Every
// score is the same sequence of operations whatever its key's index, m or the other keys. Returns
// the largest score (-inf when m = 0).
template <int DD, typename E>
float scores(const float* q, const E* const* keys, int64_t m, float scale, float* s) {
  constexpr int NV = DD / 8;
  __m256 qv[NV];
  for (int v = 0; v < NV; ++v) qv[v] = _mm256_loadu_ps(q + 8 * v);
  auto partial = [&](const E* k) {  // q . k as 8 lanes still to be summed
    __m256 a0 = _mm256_mul_ps(qv[0], load8(k)), a1 = _mm256_mul_ps(qv[1], load8(k + 8));
    for (int v = 2; v < NV; v += 2) {
      a0 = _mm256_fmadd_ps(qv[v], load8(k + 8 * v), a0);
      a1 = _mm256_fmadd_ps(qv[v + 1], load8(k + 8 * v + 8), a1);
    }
    return _mm256_add_ps(a0, a1);
  };
  const __m128 sc4 = _mm_set1_ps(scale);
  __m128 mx4 = _mm_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    const __m128 r = _mm_mul_ps(sc4, hsum4(partial(keys[i]), partial(keys[i + 1]), partial(keys[i + 2]),
                                           partial(keys[i + 3])));
    _mm_storeu_ps(s + i, r);
    mx4 = _mm_max_ps(mx4, r);
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, mx4);
  float mx = std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3]));
  if (i < m) {
    const __m256 z = _mm256_setzero_ps();
    const int64_t rem = m - i;
    _mm_store_ps(lanes, _mm_mul_ps(sc4, hsum4(partial(keys[i]), rem > 1 ? partial(keys[i + 1]) : z,
                                               rem > 2 ? partial(keys[i + 2]) : z, z)));
    for (int64_t j = 0; j < rem; ++j) mx = std::max(mx, s[i + j] = lanes[j]);
  }
  return mx;
}

// out [DD] += sum_i (w[i] * inv) * vals[i], i ascending (out read once and written once).
template <int DD, typename E>
void accumulate(const float* w, float inv, const E* const* vals, int64_t m, float* out) {
  constexpr int NV = DD / 8;
  __m256 acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = _mm256_loadu_ps(out + 8 * v);
  for (int64_t i = 0; i < m; ++i) {
    const __m256 wi = _mm256_set1_ps(w[i] * inv);
    for (int v = 0; v < NV; ++v) acc[v] = _mm256_fmadd_ps(wi, load8(vals[i] + 8 * v), acc[v]);
  }
  for (int v = 0; v < NV; ++v) _mm256_storeu_ps(out + 8 * v, acc[v]);
}

// Any D: one query row against its m keys (sbuf [m] scratch): out [D] = softmax(scale * q . k) @ v.
template <typename E>
void attend_any(const float* q, const E* const* keys, const E* const* vals, int64_t m, int64_t D,
                float scale, float* sbuf, float* out) {
  for (int64_t d = 0; d < D; ++d) out[d] = 0.f;
  if (m == 0) return;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < m; ++i) {
    sbuf[i] = scale * dot(q, keys[i], D);
    mx = std::max(mx, sbuf[i]);
  }
  const float inv = 1.f / exp_shifted(sbuf, m, mx);
  for (int64_t i = 0; i < m; ++i) axpy(sbuf[i] * inv, vals[i], out, D);
}

// Per-thread scratch of attend_group: scores [queries, keys], running maxima, widened rows.
struct Scratch {
  std::vector<float> S, mx, wide;
  std::vector<const float*> ptrs;
};

// m bfloat16 rows of DD -> float32 rows in sc.wide, exactly (a widened bf16 is the float32 with
// those high bits), and pointers to them: a block read by several queries is widened once, not once
// per query — their products are the ones direct bf16 loads give, so outputs are bit-identical.
template <int DD>
const float* const* widened(const bf16* const* rows, int64_t m, Scratch& sc) {
  if (static_cast<int64_t>(sc.ptrs.size()) < m) sc.wide.resize(m * DD), sc.ptrs.resize(m);
  for (int64_t i = 0; i < m; ++i) {
    float* w = sc.wide.data() + i * DD;
    for (int v = 0; v < DD / 8; ++v) _mm256_storeu_ps(w + 8 * v, load8(rows[i] + 8 * v));
    sc.ptrs[i] = w;
  }
  return sc.ptrs.data();
}

// Keys of one (sequence, kv head): its cached rows in order (shared by all its queries), and per new
// token t the new rows it sees. The queries of the (b, g) go through the cached rows together, kKB
// rows at a time, so a block of K (then V) rows is read from memory once for all of them and reused
// from L1 — not once per query; a bf16 block is widened once for all of them too. Per query the
// order of keys and of every operation on its own numbers is the same as one query alone would get
// (cached rows ascending, then its new rows).
constexpr int64_t kKB = 64;

template <int DD, typename E>
void attend_group(const float* Q, int64_t H, int64_t G, int64_t g, int64_t b, int64_t t0, int64_t t1,
                  const std::vector<const E*>& ck, const std::vector<const E*>& cv,
                  const std::vector<std::vector<const E*>>& nk, const std::vector<std::vector<const E*>>& nvv,
                  float scale, Scratch& sc, float* O, int64_t T) {
  const int64_t n = static_cast<int64_t>(ck.size()), nq = (t1 - t0) * G;
  int64_t width = n;
  for (int64_t t = t0; t < t1; ++t) width = std::max<int64_t>(width, n + static_cast<int64_t>(nk[t].size()));
  sc.S.resize(nq * width);
  sc.mx.assign(nq, -std::numeric_limits<float>::infinity());
  float *S = sc.S.data(), *mx = sc.mx.data();
  auto qptr = [&](int64_t t, int64_t h) { return Q + ((b * T + t) * H + g * G + h) * DD; };
  auto optr = [&](int64_t t, int64_t h) { return O + ((b * T + t) * H + g * G + h) * DD; };
  // for_block(rows, c0, m, f): f(pointers to the m rows from c0), widened first when that pays
  auto for_block = [&](const std::vector<const E*>& rows, int64_t c0, int64_t m, auto&& f) {
    if constexpr (std::is_same_v<E, bf16>) {
      if (t1 - t0 > 1) return f(widened<DD>(rows.data() + c0, m, sc));
    }
    f(rows.data() + c0);
  };
  for (int64_t c0 = 0; c0 < n; c0 += kKB) {  // scores against the cached rows, block by block
    const int64_t m = std::min(n, c0 + kKB) - c0;
    for_block(ck, c0, m, [&](auto keys) {
      for (int64_t t = t0, r = 0; t < t1; ++t)
        for (int64_t h = 0; h < G; ++h, ++r)
          mx[r] = std::max(mx[r], scores<DD>(qptr(t, h), keys, m, scale, S + r * width + c0));
    });
  }
  std::vector<float> inv(nq);
  for (int64_t t = t0, r = 0; t < t1; ++t)  // then each query's new rows; softmax weights
    for (int64_t h = 0; h < G; ++h, ++r) {
      float* s = S + r * width;
      const int64_t m = n + static_cast<int64_t>(nk[t].size());
      mx[r] = std::max(mx[r], scores<DD>(qptr(t, h), nk[t].data(), m - n, scale, s + n));
      inv[r] = m ? 1.f / exp_shifted(s, m, mx[r]) : 0.f;
      std::fill(optr(t, h), optr(t, h) + DD, 0.f);
    }
  for (int64_t c0 = 0; c0 < n; c0 += kKB) {  // values of the cached rows, block by block
    const int64_t m = std::min(n, c0 + kKB) - c0;
    for_block(cv, c0, m, [&](auto vals) {
      for (int64_t t = t0, r = 0; t < t1; ++t)
        for (int64_t h = 0; h < G; ++h, ++r)
          accumulate<DD>(S + r * width + c0, inv[r], vals, m, optr(t, h));
    });
  }
  for (int64_t t = t0, r = 0; t < t1; ++t)  // then each query's new rows
    for (int64_t h = 0; h < G; ++h, ++r)
      accumulate<DD>(S + r * width + n, inv[r], nvv[t].data(), static_cast<int64_t>(nvv[t].size()), optr(t, h));
}

// The loop over (sequence, kv head, token range) items, for K/V rows of element type E.
template <typename E>
void attend_all(const float* Q, const E* KN, const E* VN, const E* KC, const E* VC, const int64_t* TB,
                const int64_t* LN, const bool* VS, float* O, int64_t B, int64_t T, int64_t H, int64_t D,
                int64_t N, int64_t Hkv, int64_t rows, int64_t pages, int64_t page_size, float sc) {
  const int64_t G = H / Hkv;
  // One item = (b, g, a range of new tokens): the G query heads of kv head g for those tokens of
  // sequence b. Each (b, g) is one item unless there are fewer than two items a thread: then its
  // tokens are split until there are, so the threads' contiguous shares of items stay within about
  // one item of each other (SmolLM2's 3 kv heads on 2 threads: 3 items would give one thread 2).
  // A one-token step is not cut by query head: each such item would re-read the keys, which cost
  // more than the balance gained (benchmarks/bf16_store_2026-12-05).
  // Per query the keys, their order and every operation on them are the same whatever else the call
  // holds (a tree node == the plain step at its position: its ancestors are then cached rows, in
  // order), so how items are cut never changes an output.
  const int64_t groups = B * Hkv, threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t want = threads > 1 ? 2 * threads : 1;  // items wanted at least
  const int64_t split = std::min<int64_t>(T, (want + groups - 1) / groups), per = (T + split - 1) / split;
  at::parallel_for(0, groups * split, 1, [&](int64_t i0, int64_t i1) {
    Scratch scratch;
    std::vector<float> sbuf;
    std::vector<const E*> ck, cv;
    std::vector<std::vector<const E*>> nk(T), nvv(T);
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t bg = item / split, g = bg % Hkv, b = bg / Hkv, n = LN[b];
      const int64_t t0 = (item % split) * per, t1 = std::min(T, t0 + per);
      if (t0 >= t1) continue;
      ck.clear(), cv.clear();
      for (int64_t c0 = 0; c0 < n; c0 += page_size) {  // cached rows, page by page
        const int64_t row0 = TB[b * pages + c0 / page_size] * page_size, cnt = std::min(page_size, n - c0);
        TORCH_CHECK(row0 >= 0 && row0 + cnt <= rows, "paged_attention: a page table entry is outside the cache");
        for (int64_t r = row0; r < row0 + cnt; ++r) {
          ck.push_back(KC + (r * Hkv + g) * D);
          cv.push_back(VC + (r * Hkv + g) * D);
        }
      }
      for (int64_t t = t0; t < t1; ++t) {  // the new rows each token sees
        nk[t].clear(), nvv[t].clear();
        for (int64_t j = 0; j < N; ++j) {
          if (!VS[(b * T + t) * N + j]) continue;
          nk[t].push_back(KN + ((b * N + j) * Hkv + g) * D);
          nvv[t].push_back(VN + ((b * N + j) * Hkv + g) * D);
        }
      }
      if (D == 64) {
        attend_group<64, E>(Q, H, G, g, b, t0, t1, ck, cv, nk, nvv, sc, scratch, O, T);
      } else if (D == 128) {
        attend_group<128, E>(Q, H, G, g, b, t0, t1, ck, cv, nk, nvv, sc, scratch, O, T);
      } else {
        std::vector<const E*> keys, vals;
        for (int64_t t = t0; t < t1; ++t) {
          keys.assign(ck.begin(), ck.end()), vals.assign(cv.begin(), cv.end());
          keys.insert(keys.end(), nk[t].begin(), nk[t].end()), vals.insert(vals.end(), nvv[t].begin(), nvv[t].end());
          sbuf.resize(keys.size());
          for (int64_t h = 0; h < G; ++h)
            attend_any(Q + ((b * T + t) * H + g * G + h) * D, keys.data(), vals.data(),
                       static_cast<int64_t>(keys.size()), D, sc, sbuf.data(), O + ((b * T + t) * H + g * G + h) * D);
        }
      }
    }
  });
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                           const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& table,
                           const at::Tensor& lengths, const at::Tensor& vis, int64_t page_size, double scale) {
  // q [B, T, H, D]; k_new, v_new [B, N, Hkv, D]; k_cache, v_cache [rows, Hkv, D] (one layer);
  // table [B, pages] int64; lengths [B] int64; vis [B, T, N] bool -> [B, T, H, D]
  TORCH_CHECK(q.dim() == 4 && k_new.dim() == 4 && v_new.dim() == 4 && k_cache.dim() == 3 && v_cache.dim() == 3,
              "paged_attention: q, k_new, v_new must be 4-D and the caches 3-D");
  const auto kv = k_cache.scalar_type();
  TORCH_CHECK(q.scalar_type() == at::kFloat && (kv == at::kFloat || kv == at::kBFloat16) &&
              k_new.scalar_type() == kv && v_new.scalar_type() == kv && v_cache.scalar_type() == kv,
              "paged_attention: q must be float32, and k_new, v_new and both caches one dtype, float32 or bfloat16");
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
  if (B == 0 || T == 0) return out;  // no query: nothing to attend (the work split below divides by both)
  const float* Q = qc.data_ptr<float>();
  const int64_t *TB = tb.data_ptr<int64_t>(), *LN = ln.data_ptr<int64_t>();
  const bool* VS = vs.data_ptr<bool>();
  float* O = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(LN[b] >= 0 && LN[b] <= pages * page_size, "paged_attention: a length exceeds its page table");

  if (kc.scalar_type() == at::kFloat) {
    attend_all<float>(Q, kn.data_ptr<float>(), vn.data_ptr<float>(), kc.data_ptr<float>(), vc.data_ptr<float>(), TB, LN,
                      VS, O, B, T, H, D, N, Hkv, rows, pages, page_size, sc);
  } else {
    auto bits = [](const at::Tensor& t) { return reinterpret_cast<const bf16*>(t.data_ptr<at::BFloat16>()); };
    attend_all<bf16>(Q, bits(kn), bits(vn), bits(kc), bits(vc), TB, LN, VS, O, B, T, H, D, N, Hkv, rows, pages,
                     page_size, sc);
  }
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
