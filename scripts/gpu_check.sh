#!/usr/bin/env bash
# One short GPU check (<= 8 minutes) for a machine with CUDA (issue 9):
#   1. the CUDA-marked tests: greedy dflash/ddtree == ar on the GPU, eager and compiled, fp32 and bf16,
#      and the CUDA-graph capture probe of `flashtree env`;
#   2. a bench of the eager vs the compiled runner (interleaved) on a random ~0.5 B qwen3 target with a
#      random drafter: costs only (tau is meaningless on random weights);
#   3. every method on the bundled tiny-code pair with device and dtype "auto" (eager: compiling it
#      takes minutes there), greedy and sampled, with the chi-square exactness column for T=1.
# Without CUDA it says so and exits 0. Runs from a bare checkout too (a machine whose torch is not the
# pinned one, without `pip install`): then it puts src/ on the path. Usage: scripts/gpu_check.sh [OUT_DIR]
set -uo pipefail  # every part runs; the exit status says whether any failed
failed=0
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python
OUT=${1:-${OUT:-gpu-check}}
"$PY" -c "import flashtree" 2>/dev/null || export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False): nothing to check"
  exit 0
fi
mkdir -p "$OUT"
"$PY" -c "import torch; print('gpu_check:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
timeout 300 "$PY" -m pytest -q -m gpu tests/test_cuda.py tests/test_env.py 2>&1 | tee "$OUT/tests.txt" || failed=1
timeout 240 "$PY" - "$OUT" <<'PY' 2>&1 | tee "$OUT/bench.txt"
import sys, subprocess
from pathlib import Path
import torch, transformers
sys.path.insert(0, "tests")
from helpers import make_drafter, write_tokenizer
out = Path(sys.argv[1])
cfg = transformers.Qwen3Config(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=24,
                               num_attention_heads=16, num_key_value_heads=8, head_dim=64,
                               max_position_embeddings=2048, tie_word_embeddings=True)
torch.manual_seed(0)
model = transformers.Qwen3ForCausalLM(cfg)
print(f"random target: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters")
model.save_pretrained(out / "target")
write_tokenizer(out / "target", cfg.vocab_size)
make_drafter(out / "drafter", out / "target", block_size=16, layers=1)
subprocess.run([sys.executable, "-m", "flashtree.cli", "bench", "--model", str(out / "target"), "--draft",
                str(out / "drafter"), "--device", "cuda", "--dtype", "bfloat16", "--methods", "ar,dflash,ddtree",
                "--budgets", "16", "--temperatures", "0", "--num-prompts", "4", "--max-tokens", "64", "--repeats", "2",
                "--no-peers", "--exact-samples", "0", "--compile-modes", "eager,compiled", "--out", str(out / "bench")],
               check=True)
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
timeout 150 "$PY" -m flashtree.cli bench --model tiny-code --device auto --dtype auto --no-compile \
  --methods ngram,dflash,ddtree,hybrid --budgets 8 --temperatures 0,1 --num-prompts 4 --max-tokens 48 --repeats 1 \
  --no-peers --exact-samples 500 \
  --out "$OUT/tiny" 2>&1 | tee "$OUT/tiny.txt" || failed=1
echo "gpu_check: done; results in $OUT; $([ $failed = 0 ] && echo 'all parts passed' || echo 'A PART FAILED')"
exit $failed
