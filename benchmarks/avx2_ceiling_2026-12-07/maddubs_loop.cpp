#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <ctime>
#include <cstdlib>
static double now(){timespec a; clock_gettime(CLOCK_MONOTONIC,&a); return a.tv_sec+a.tv_nsec*1e-9;}
template <int MR, int NR>
__attribute__((noinline)) void run(const int8_t* x, const uint8_t* w, int K, __m256i* out) {
  const __m256i mask = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  __m256i acc32[MR][NR] = {};
  for (int sb = 0; sb < K / 256; ++sb) {
    __m256i s16[MR][NR] = {};
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      __m256i b[NR];
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        const __m128i t = _mm_loadu_si128((const __m128i*)(w + j * (K / 2) + sb * 128 + g * 16));
        b[j] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), mask);
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m256i xv = _mm256_loadu_si256((const __m256i*)(x + i * K + sb * 256 + g * 32));
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) s16[i][j] = _mm256_add_epi16(s16[i][j], _mm256_maddubs_epi16(b[j], xv));
      }
    }
    for (int i = 0; i < MR; ++i) for (int j = 0; j < NR; ++j) acc32[i][j] = _mm256_add_epi32(acc32[i][j], _mm256_madd_epi16(s16[i][j], ones));
  }
  for (int i = 0; i < MR; ++i) for (int j = 0; j < NR; ++j) out[i * NR + j] = _mm256_add_epi32(out[i * NR + j], acc32[i][j]);
}
template <int MR, int NR> void bench(const int8_t* x, const uint8_t* w, int K, __m256i* out) {
  long reps = 1000000;
  double t = now();
  for (long r = 0; r < reps; ++r) run<MR, NR>(x, w, K, out);
  double dt = now() - t;
  printf("MR=%d NR=%d: %.1f GMAC/s\n", MR, NR, double(MR) * NR * K * reps / dt / 1e9);
}
int main() {
  const int K = 2048;
  int8_t* x = (int8_t*)aligned_alloc(64, 8 * K);
  uint8_t* w = (uint8_t*)aligned_alloc(64, 4 * K / 2);
  for (int i = 0; i < 8 * K; ++i) x[i] = rand() % 255 - 127;
  for (int i = 0; i < 4 * K / 2; ++i) w[i] = rand();
  __m256i out[16] = {};
  bench<4, 1>(x, w, K, out); bench<4, 2>(x, w, K, out); bench<2, 4>(x, w, K, out); bench<3, 3>(x, w, K, out); bench<1, 1>(x, w, K, out);
  int s = 0; for (int i = 0; i < 16; ++i) s += _mm256_extract_epi32(out[i], 0);
  return s == 12345;
}
