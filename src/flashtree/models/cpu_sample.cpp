// flashtree::sample_rows — the whole sampling pipeline for rows of logits on the CPU, a few passes
// per row (`sampling.sample_host`). The rule is `sampling.logits_to_probs` + `sampling.sample`:
//
//   greedy rows (temperature 0): the first maximum (the first NaN if any, as numpy's argmax)
//   scaled = logits / temperature (float32), top = its max, p = exp(scaled - top) (unnormalised)
//   cut    = max(top-k's k-th largest logit, top-p's nucleus cut, top + log(min_p))
//   kept   = tokens whose logit reaches the cut (ties with it all kept)
//   token  = the first kept token whose float64 running mass exceeds u * (their total mass),
//            or V when the row has no valid mass (NaN, inf or zero)
//
// top-p's cut is the largest logit c with mass{logit >= c} >= top_p * z (z: the mass of the
// whole row, or of its k largest under top-k) -- the value the sorted prefix sum ends on. Found
// by quickselect on the logit (expected linear), among the candidates only when there is no
// top-k: the tokens with p >= (1 - top_p) z / V (the others hold less than (1 - top_p) z in all,
// so the nucleus ends among the candidates; all tokens when rounding says otherwise).
//
// The draw: float64 sums of blocks of kBlock kept masses and their running total pick the block
// where the mass passes u * total, then a running sum inside it picks the token. The block's
// inner sum is the same additions in the same order as its block sum, so the running total
// reached at its end is the block's end exactly: the token is always found, and a token without
// mass never is (the running sum does not move on it).
//
// exp is cpu_kernels.h's exp8 (Cephes' polynomial on 8 lanes, relative error ~1e-7; 0 below -87.3,
// where float32's normal range ends: such a token's probability is < 1e-38 of the top's).
//
// Why: numpy calls cost ~1-5 us each on the reference 2-core CPU and the pipeline took ~25 of
// them (50-200 us a row); torch's was ~60 ops (0.4-0.7 ms a row).
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>

#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kBlock = 64;
constexpr int64_t kSortedTopk = 64;  // top-k up to this takes the k largest in one pass (cpu_topk.cpp's)

using flashtree_kernels::exp8;

// scaled = x / T and its max; false when the row has a NaN (then nothing else is written).
bool scale_row(const float* x, int64_t V, float T, float* scaled, float& top) {
  const __m256 t = _mm256_set1_ps(T);
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) {
    const __m256 v = _mm256_div_ps(_mm256_loadu_ps(x + i), t);
    _mm256_storeu_ps(scaled + i, v);
    m = _mm256_max_ps(m, v);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, m);
  top = lanes[0];
  for (int q = 1; q < 8; ++q) top = std::max(top, lanes[q]);
  bool has_nan = _mm256_movemask_ps(nan) != 0;
  for (; i < V; ++i) {
    scaled[i] = x[i] / T;
    has_nan |= std::isnan(scaled[i]);
    top = std::max(top, scaled[i]);
  }
  return !has_nan;
}

// p = exp(scaled - top).
void exp_row(const float* scaled, int64_t V, float top, float* p) {
  const __m256 t = _mm256_set1_ps(top);
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) _mm256_storeu_ps(p + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(scaled + i), t)));
  if (i < V) {
    float in[8], out[8];
    for (int q = 0; q < 8; ++q) in[q] = i + q < V ? scaled[i + q] - top : 0.0f;
    _mm256_storeu_ps(out, exp8(_mm256_loadu_ps(in)));
    for (int q = 0; i + q < V; ++q) p[i + q] = out[q];
  }
}

// The first maximum of x (the first NaN if there is one), as numpy's argmax.
int64_t argmax_row(const float* x, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 0; i < V; ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > x[best]) best = i;
  }
  return best;
}

struct Item {
  float logit;
  float mass;
};

// The largest logit c among items[0, n) with mass{logit >= c} >= need; NaN when the items' whole
// mass falls short of need (rounding). Reorders items.
float nucleus_cut(Item* items, int64_t n, double need) {
  int64_t lo = 0, hi = n;  // undecided range; items before lo are above every one in it
  double above = 0.0;      // mass of the items before lo
  while (lo < hi) {
    const float a = items[lo].logit, b = items[lo + (hi - lo) / 2].logit, c = items[hi - 1].logit;
    const float pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));  // median of three
    // three-way partition of [lo, hi): > pivot | == pivot | < pivot
    int64_t gt = lo, i = lo, lt = hi;
    while (i < lt) {
      if (items[i].logit > pivot) std::swap(items[i++], items[gt++]);
      else if (items[i].logit < pivot) std::swap(items[i], items[--lt]);
      else ++i;
    }
    double m_gt = 0.0, m_eq = 0.0;
    for (int64_t j = lo; j < gt; ++j) m_gt += items[j].mass;
    for (int64_t j = gt; j < lt; ++j) m_eq += items[j].mass;
    if (above + m_gt >= need) {
      hi = gt;  // the cut is above the pivot
    } else if (above + m_gt + m_eq >= need) {
      return pivot;
    } else {
      above += m_gt + m_eq;
      lo = lt;
    }
  }
  return std::numeric_limits<float>::quiet_NaN();
}

// The row's cut (see the top of the file); -inf keeps everything.
float row_cut(const float* s, const float* p, int64_t V, float top, int64_t k, float top_p, float min_p,
              std::vector<Item>& items) {
  double cut = min_p > 0 ? double(top) + std::log(double(min_p)) : -std::numeric_limits<double>::infinity();
  const bool topk = k > 0 && k < V;
  if (topk || top_p < 1) {
    float c;
    if (topk && k <= kSortedTopk) {  // the k largest, sorted: top-p walks them in order
      float bv[kSortedTopk];
      int64_t bi[kSortedTopk];
      flashtree_kernels::topk_row(s, V, k, bv, bi);
      c = bv[k - 1];
      if (top_p < 1) {
        double z = 0.0;
        for (int64_t j = 0; j < k; ++j) z += p[bi[j]];
        double e = 0.0;  // the sorted prefix's mass: the cut is where it first reaches top_p z
        for (int64_t j = 0; j < k; ++j) {
          e += p[bi[j]];
          if (e >= double(top_p) * z) {
            c = bv[j];
            break;
          }
        }
      }
    } else if (topk) {
      items.resize(V);
      for (int64_t i = 0; i < V; ++i) items[i] = {s[i], p[i]};
      std::nth_element(items.begin(), items.begin() + (k - 1), items.end(),
                       [](const Item& x, const Item& y) { return x.logit > y.logit; });
      c = items[k - 1].logit;  // the k-th largest: items[0, k) are the k largest
      if (top_p < 1) {
        double z = 0.0;
        for (int64_t i = 0; i < k; ++i) z += items[i].mass;
        const float cp = nucleus_cut(items.data(), k, double(top_p) * z);
        if (!std::isnan(cp)) c = std::max(c, cp);
      }
    } else {
      double z4[4] = {0.0, 0.0, 0.0, 0.0};  // the row's mass (a threshold's input: any order)
      int64_t i = 0;
      for (; i + 4 <= V; i += 4)
        for (int q = 0; q < 4; ++q) z4[q] += p[i + q];
      for (; i < V; ++i) z4[0] += p[i];
      const double z = (z4[0] + z4[1]) + (z4[2] + z4[3]);
      const double floor = (1.0 - double(top_p)) * z / double(V);
      items.clear();
      for (int64_t i = 0; i < V; ++i)
        if (p[i] >= floor) items.push_back({s[i], p[i]});
      c = nucleus_cut(items.data(), int64_t(items.size()), double(top_p) * z);
      if (std::isnan(c)) {  // rounding left the candidates short: all tokens
        items.resize(V);
        for (int64_t i = 0; i < V; ++i) items[i] = {s[i], p[i]};
        c = nucleus_cut(items.data(), V, double(top_p) * z);
      }
      if (std::isnan(c)) c = -std::numeric_limits<float>::infinity();
    }
    cut = std::max(cut, double(c));
  }
  const double lowest = double(std::numeric_limits<float>::lowest());
  return float(cut < lowest ? lowest : cut);  // a -inf logit then gets no mass (it never did)
}

// The kept mass of row tokens [i0, i1) (> kBlock apart or not), added one at a time in order.
inline double block_mass(const float* s, const float* p, int64_t i0, int64_t i1, float cut) {
  double m = 0.0;
  for (int64_t i = i0; i < i1; ++i) m += s[i] >= cut ? double(p[i]) : 0.0;
  return m;
}

int64_t draw_row(const float* s, const float* p, int64_t V, float cut, double u, std::vector<double>& sums) {
  const int64_t nb = (V + kBlock - 1) / kBlock, full = V / kBlock;
  sums.resize(nb);
  int64_t b = 0;
  for (; b + 4 <= full; b += 4) {  // four blocks' sums at once (each still one at a time, in order)
    double m0 = 0.0, m1 = 0.0, m2 = 0.0, m3 = 0.0;
    const int64_t o = b * kBlock;
    for (int64_t i = o; i < o + kBlock; ++i) {
      m0 += s[i] >= cut ? double(p[i]) : 0.0;
      m1 += s[i + kBlock] >= cut ? double(p[i + kBlock]) : 0.0;
      m2 += s[i + 2 * kBlock] >= cut ? double(p[i + 2 * kBlock]) : 0.0;
      m3 += s[i + 3 * kBlock] >= cut ? double(p[i + 3 * kBlock]) : 0.0;
    }
    sums[b] = m0, sums[b + 1] = m1, sums[b + 2] = m2, sums[b + 3] = m3;
  }
  for (; b < nb; ++b) sums[b] = block_mass(s, p, b * kBlock, std::min(V, (b + 1) * kBlock), cut);
  double total = 0.0;
  for (b = 0; b < nb; ++b) total += sums[b];
  if (!(std::isfinite(total) && total > 0)) return V;
  const double target = std::min(u * total, std::nextafter(total, 0.0));  // < total
  double before = 0.0;
  for (int64_t b = 0; b < nb; ++b) {
    const double after = before + sums[b];
    if (after > target) {  // inside this block: the same additions again, in the same order
      const int64_t end = std::min(V, (b + 1) * kBlock);
      double m = 0.0;
      for (int64_t i = b * kBlock; i < end; ++i) {
        m += s[i] >= cut ? double(p[i]) : 0.0;
        if (before + m > target) return i;
      }
      return end - 1;  // not reached: before + (the block's sum) == after > target
    }
    before = after;
  }
  return V;  // not reached: the last block's end is the total
}

at::Tensor sample_rows(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
                       const at::Tensor& top_p, const at::Tensor& min_p, const at::Tensor& u) {
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == at::kFloat && logits.dim() == 2,
              "flashtree::sample_rows: logits must be a float32 CPU tensor [S, V]");
  const int64_t S = logits.size(0), V = logits.size(1);
  TORCH_CHECK(temperature.numel() == S && top_k.numel() == S && top_p.numel() == S && min_p.numel() == S &&
                  u.numel() == S && temperature.scalar_type() == at::kFloat && top_k.scalar_type() == at::kLong &&
                  top_p.scalar_type() == at::kFloat && min_p.scalar_type() == at::kFloat &&
                  u.scalar_type() == at::kDouble,
              "flashtree::sample_rows: temperature, top_p, min_p float32, top_k int64, u float64, one per row");
  const at::Tensor xc = logits.contiguous(), tc = temperature.contiguous(), kc = top_k.contiguous(),
                   pc = top_p.contiguous(), mc = min_p.contiguous(), uc = u.contiguous();
  at::Tensor out = at::empty({S}, logits.options().dtype(at::kLong));
  const float *xp = xc.data_ptr<float>(), *tp = tc.data_ptr<float>();
  const int64_t* kp = kc.data_ptr<int64_t>();
  const float *topp = pc.data_ptr<float>(), *minp = mc.data_ptr<float>();
  const double* up = uc.data_ptr<double>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, S, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> scaled(V), p(V);
    std::vector<Item> items;
    std::vector<double> sums;
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = xp + r * V;
      if (tp[r] == 0) {
        op[r] = argmax_row(x, V);
        continue;
      }
      float top;
      if (!scale_row(x, V, tp[r], scaled.data(), top) || !std::isfinite(top)) {
        op[r] = V;  // a NaN or +inf logit, or nothing but -inf: no valid mass
        continue;
      }
      exp_row(scaled.data(), V, top, p.data());
      const float cut = row_cut(scaled.data(), p.data(), V, top, kp[r], topp[r], minp[r], items);
      op[r] = draw_row(scaled.data(), p.data(), V, cut, up[r], sums);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(flashtree, m) {
  m.def("sample_rows(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, Tensor u) -> Tensor");
}

TORCH_LIBRARY_IMPL(flashtree, CPU, m) {
  m.impl("sample_rows", &sample_rows);
}
