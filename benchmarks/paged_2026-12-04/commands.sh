# Issue 41.3, a long prompt beside 4 decoding ar streams (session 28; AMD EPYC, avx512_bf16, 2 cores,
# `../shared/tools/quiet` load 0.3 first; dtype auto = bf16). The ratio is the streams' largest gap while
# the 1,800-token prompt (default method ddtree, budget auto, max_tokens=1) prefills and the 60 steps
# after it, over the median of their 30 undisturbed steps before it.
python benchmarks/paged_2026-12-04/measure_paged.py --parts chunked --model smollm2-135m-instruct --out benchmarks/paged_2026-12-04/chunked_smollm2.json
#   paced (prefill_stall 2): 4.00x, TTFT 10.1 s | rows only: 48.3x, 3.4 s | one step: 228x, 4.7 s
python benchmarks/paged_2026-12-04/measure_paged.py --parts chunked --model tiny-code --out benchmarks/paged_2026-12-04/chunked_tiny.json
#   paced: 10.4x, TTFT 0.85 s | rows only: 40.4x, 0.19 s | one step: 328x, 0.41 s
# other stalls, real model, paced run only (separate runs):
python benchmarks/paged_2026-12-04/measure_paged.py --parts chunked --model smollm2-135m-instruct --stall 3   # 5.60x, TTFT 7.1 s
python benchmarks/paged_2026-12-04/measure_paged.py --parts chunked --model smollm2-135m-instruct --stall 4   # 6.09x, TTFT 4.4 s
