#include <stdio.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec a; clock_gettime(CLOCK_MONOTONIC,&a); return a.tv_sec+a.tv_nsec*1e-9;}
int main(){
  long n=300000000; long x=3;
  double a=now();
  for(long i=0;i<n;i++){ __asm__ volatile("imul %0, %0\n\timul %0, %0" : "+r"(x)); }
  double t=now()-a;
  double ghz = 6.0*n/t/1e9;
  printf("imul chain (3 cyc): %.2f GHz\n", ghz);
  __m256i acc0=_mm256_setzero_si256(),acc1=acc0,acc2=acc0,acc3=acc0,acc4=acc0,acc5=acc0;
  __m256i u=_mm256_set1_epi8(3), s=_mm256_set1_epi8(5);
  long m=100000000;
  a=now();
  for(long i=0;i<m;i++){
    __asm__ volatile(
      "vpmaddubsw %6, %7, %%ymm8\n\t vpaddw %%ymm8, %0, %0\n\t"
      "vpmaddubsw %6, %7, %%ymm9\n\t vpaddw %%ymm9, %1, %1\n\t"
      "vpmaddubsw %6, %7, %%ymm10\n\t vpaddw %%ymm10, %2, %2\n\t"
      "vpmaddubsw %6, %7, %%ymm11\n\t vpaddw %%ymm11, %3, %3\n\t"
      "vpmaddubsw %6, %7, %%ymm12\n\t vpaddw %%ymm12, %4, %4\n\t"
      "vpmaddubsw %6, %7, %%ymm13\n\t vpaddw %%ymm13, %5, %5\n\t"
      : "+x"(acc0),"+x"(acc1),"+x"(acc2),"+x"(acc3),"+x"(acc4),"+x"(acc5) : "x"(u),"x"(s) : "ymm8","ymm9","ymm10","ymm11","ymm12","ymm13");
  }
  t=now()-a;
  printf("maddubs+addw: %.2f G/s = %.2f per cycle\n", 6.0*m/t/1e9, 6.0*m/t/1e9/ghz);
  return _mm256_extract_epi16(acc0,0)+_mm256_extract_epi16(acc5,0) == 1234567;
}
