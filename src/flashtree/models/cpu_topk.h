// What the CPU kernels share between their files (one library, built together by cpu_dense.py).
#pragma once
#include <cstdint>

namespace flashtree_kernels {

// The k largest values of x[0, V) into bv[0, k), descending, their indices into bi (the lower
// index first among equal values); NaN is never selected (short rows pad with -inf at index -1).
void topk_row(const float* x, int64_t V, int64_t k, float* bv, int64_t* bi);

}  // namespace flashtree_kernels
