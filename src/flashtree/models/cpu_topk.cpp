// flashtree::topk — the k largest values of each row of a float32 [..., V] and their indices,
// descending; among equal values the lower index first. NaN is never selected (a row with fewer
// than k selectable values pads with -inf at index -1).
//
// Why: each drafter round takes the top few (k <= ~16) of 4,096 log-probs for 7 positions, and
// torch.topk on the CPU costs ~68 us for that at any k on the reference 2-core CPU (per-row sort
// machinery and a parallel region; this kernel ~19 us); the selection is one pass over 28 K floats.
//
// How: one pass per row keeping a sorted buffer of k; 8 values at a time are compared with the
// buffer's last (AVX2) and only those above it are inserted. Rows are split across threads only
// when there are many.
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>

#include "cpu_kernels.h"

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

namespace {

// Insert (v, i) into the sorted (descending) buffer of n < = k entries; i exceeds every index in it,
// so it goes after the entries >= v (the lower index wins a tie).
inline void insert(float* bv, int64_t* bi, int64_t& n, int64_t k, float v, int64_t i) {
  int64_t pos = n < k ? n : k - 1;
  while (pos > 0 && bv[pos - 1] < v) {
    if (pos < k) bv[pos] = bv[pos - 1], bi[pos] = bi[pos - 1];
    --pos;
  }
  bv[pos] = v, bi[pos] = i;
  if (n < k) ++n;
}

}  // namespace

namespace flashtree_kernels {

void topk_row(const float* x, int64_t V, int64_t k, float* bv, int64_t* bi) {
  int64_t n = 0, i = 0;
  for (; i < V && n < k; ++i)  // fill the buffer (NaN skipped)
    if (!std::isnan(x[i])) insert(bv, bi, n, k, x[i], i);
  for (; i + 8 <= V; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    int mask = _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(bv[k - 1]), _CMP_GT_OQ));
    while (mask) {
      const int j = __builtin_ctz(mask);
      mask &= mask - 1;
      if (x[i + j] > bv[k - 1]) insert(bv, bi, n, k, x[i + j], i + j);  // the threshold may have risen
    }
  }
  for (; i < V; ++i)
    if (x[i] > bv[k - 1] || (n < k && !std::isnan(x[i]))) insert(bv, bi, n, k, x[i], i);
  for (; n < k; ++n) bv[n] = -std::numeric_limits<float>::infinity(), bi[n] = -1;
}

}  // namespace flashtree_kernels

namespace {

using flashtree_kernels::topk_row;

std::tuple<at::Tensor, at::Tensor> topk(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 1,
              "flashtree::topk: x must be a float32 CPU tensor");
  const int64_t V = x.size(-1);
  TORCH_CHECK(k >= 1 && k <= V, "flashtree::topk: k must be in [1, ", V, "], got ", k);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = k;
  at::Tensor values = at::empty(shape, x.options()), ids = at::empty(shape, x.options().dtype(at::kLong));
  const at::Tensor xc = x.contiguous();
  const int64_t R = V ? xc.numel() / V : 0;
  const float* xp = xc.data_ptr<float>();
  float* vp = values.data_ptr<float>();
  int64_t* ip = ids.data_ptr<int64_t>();
  at::parallel_for(0, R, 32, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) topk_row(xp + r * V, V, k, vp + r * k, ip + r * k);
  });
  return {values, ids};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(flashtree, m) {
  m.def("topk(Tensor x, int k) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(flashtree, CPU, m) {
  m.impl("topk", &topk);
}
