"""Export check (issue 15): run the bundled pair in OpenVINO GenAI's DFlash pipeline and compare its
acceptance with flashtree's on the same held-out prompts (greedy, same token ids in, block 8).
Not CI: it needs OpenVINO GenAI + optimum-intel, whose pins (transformers<5.6, tokenizers<=0.23.0,
huggingface-hub<1.22) clash with the project's environment. One way, beside the project's venv:

  .venv/bin/pip install --target /tmp/ovpkgs --no-deps openvino==2026.4.1 openvino-genai==2026.4.1.0 \
      openvino-tokenizers==2026.4.1.0 optimum-intel==2.2.0 optimum==2.3.0 "transformers>=5.5,<5.6" \
      tokenizers==0.22.2 "huggingface-hub>=1.5,<1.22" requests urllib3 charset-normalizer certifi
  PYTHONPATH=/tmp/ovpkgs .venv/bin/python benchmarks/openvino_2026-12-01/check_openvino.py [--drafter DIR] [--prompts 32]

Both engines are lossless at T=0, so their outputs must be the target's greedy continuation; τ is
tokens committed per target verify round (accepted drafts + the bonus). Exits 1 when OpenVINO's
mean τ is more than --tolerance (10 %) away from flashtree's, or when the outputs differ.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from flashtree import LLM, SamplingParams
from flashtree.llm import BUNDLED_DRAFTER, BUNDLED_TARGET
from flashtree.tokenizer import Tokenizer
from flashtree.train.corpus import load_prompts

# optimum-intel loads DFlash drafters through its own modeling file, whose unused imports
# (diffusers, einops) transformers' remote-code check would demand; the check is skipped.
EXPORT = """
import sys
import transformers.dynamic_module_utils as dm
dm.check_imports = lambda filename: dm.get_relative_imports(filename)
from optimum.commands.optimum_cli import main
sys.argv = ["optimum-cli", "export", "openvino", "--model", sys.argv[1], "--task", "text-generation-with-past",
            "--weight-format", "fp32", "--trust-remote-code", sys.argv[2]]
main()
"""


def export(src: Path, dst: Path) -> None:
    if not (dst / "openvino_model.xml").is_file():
        subprocess.run([sys.executable, "-c", EXPORT, str(src), str(dst)], check=True)


def openvino_run(target: Path, drafter: Path, prompts: list[list[int]], max_tokens: int):
    import openvino as ov
    import openvino_genai as ov_genai
    sched = ov_genai.SchedulerConfig()
    sched.enable_prefix_caching = False  # DFlash on paged attention refuses prefix caching
    sched.cache_size = 1
    f32 = {"INFERENCE_PRECISION_HINT": "f32"}  # the CPU plugin may otherwise run bf16 where the CPU has it
    pipe = ov_genai.LLMPipeline(str(target), "CPU", draft_model=ov_genai.draft_model(str(drafter), "CPU", **f32),
                                scheduler_config=sched, **f32)
    cfg = ov_genai.GenerationConfig()
    cfg.max_new_tokens, cfg.do_sample, cfg.ignore_eos, cfg.apply_chat_template = max_tokens, False, True, False
    cfg.num_assistant_tokens = 7  # the drafter's block size is read from its export; this only enables speculation
    outs, taus = [], []
    for p in prompts:
        r = pipe.generate(ov.Tensor(np.asarray([p], dtype=np.int64)), cfg)
        outs.append(list(r.tokens[0]))
        taus += list(r.extended_perf_metrics.main_model_metrics.raw_metrics.m_batch_sizes)[1:]  # [0] is the prefill
    return outs, taus


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--drafter", default=str(BUNDLED_DRAFTER))
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--work", default="runs/openvino", help="where the OpenVINO exports go")
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--out", default=None, help="write the comparison as JSON here")
    a = p.parse_args()
    work, drafter = Path(a.work), Path(a.drafter)
    export(BUNDLED_TARGET, work / "target")
    export(drafter, work / ("drafter-" + drafter.resolve().name))
    tok = Tokenizer(BUNDLED_TARGET)
    prompts = [tok.encode(t) for t in load_prompts()[: a.prompts]]

    llm = LLM(BUNDLED_TARGET, str(drafter), max_batch_size=8)
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
    ft = llm.generate(prompts, params, method="dflash")
    ft_taus = [t for o in ft for t in o.metrics.accept_lengths]
    ov_outs, ov_taus = openvino_run(work / "target", work / ("drafter-" + drafter.resolve().name), prompts,
                                    a.max_tokens)

    same = sum(o.token_ids == v for o, v in zip(ft, ov_outs))
    report = {"drafter": str(drafter), "prompts": len(prompts), "max_tokens": a.max_tokens,
              "flashtree_tau": float(np.mean(ft_taus)), "openvino_tau": float(np.mean(ov_taus)),
              "flashtree_rounds": len(ft_taus), "openvino_rounds": len(ov_taus), "identical_outputs": same}
    report["ratio"] = report["openvino_tau"] / report["flashtree_tau"]
    print(json.dumps(report, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if abs(report["ratio"] - 1) <= a.tolerance and same == len(prompts) else 1


if __name__ == "__main__":
    sys.exit(main())
