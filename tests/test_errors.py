"""Bad input gets a clear error naming the problem; the CLI prints one line and exits 2."""
import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashtree import LLM, SamplingParams
from flashtree.config import ConfigError
from flashtree.models.loader import load_drafter, load_target
from helpers import make_drafter, make_hf_target


@pytest.fixture()
def target_dir(tiny_pair, tmp_path):
    d = tmp_path / "t"
    shutil.copytree(tiny_pair[0], d)
    return d


def test_missing_directory_and_weights(tmp_path, target_dir):
    with pytest.raises(ConfigError, match="not found"):
        load_target(tmp_path / "nope")
    (target_dir / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="no \\*.safetensors"):
        load_target(target_dir)


def test_pickle_weights_are_refused_by_name(target_dir):
    (target_dir / "model.safetensors").rename(target_dir / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="never unpickles"):
        load_target(target_dir)


def test_unsupported_model_type(target_dir):
    cfg = json.loads((target_dir / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (target_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="model_type.*gpt2.*qwen3, llama, qwen2"):
        load_target(target_dir)


def test_wrong_shape_and_missing_tensor(target_dir):
    w = load_file(target_dir / "model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    w[name] = torch.zeros(3, 3)
    save_file(w, target_dir / "model.safetensors")
    with pytest.raises(ConfigError, match=f"'{name}' has shape \\[3, 3\\]"):
        load_target(target_dir)
    del w[name]
    save_file(w, target_dir / "model.safetensors")
    with pytest.raises(ConfigError, match="missing.*up_proj"):
        load_target(target_dir)


def test_mismatched_pair_names_both_files_and_the_field(tmp_path, tiny_pair):
    other = make_hf_target(tmp_path / "other", "qwen3", vocab_size=120)
    drafter = make_drafter(tmp_path / "d", other)
    target = load_target(tiny_pair[0], dtype="float32", device="cpu")
    with pytest.raises(ConfigError, match="vocab_size") as e:
        load_drafter(drafter, target)
    assert str(tiny_pair[0]) in str(e.value) and str(drafter) in str(e.value)
    cfg = json.loads((tiny_pair[1] / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [0, 7]
    bad = tmp_path / "bad"
    shutil.copytree(tiny_pair[1], bad)
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="target_layer_ids.*out of range"):
        load_drafter(bad, target)


def test_refused_configurations_never_fall_back(tiny_pair):
    with pytest.raises(ValueError, match="needs a drafter"):
        LLM(model=tiny_pair[0], method="ddtree")
    with pytest.raises(ValueError, match="block_size must be an integer in \\[2, 8\\]"):
        LLM(model=tiny_pair[0], draft=tiny_pair[1], method="dflash", block_size=16)
    llm = LLM(model=tiny_pair[0], draft=tiny_pair[1], method="ddtree", max_model_len=64)
    with pytest.raises(ValueError, match="budget"):
        llm.generate([[1, 2]], SamplingParams(max_tokens=2), budget=0)
    with pytest.raises(ValueError, match="method 'beam'"):
        llm.generate([[1, 2]], method="beam")
    with pytest.raises(ValueError, match="context limit is 64"):
        llm.generate([list(range(1, 80))])
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]])
    with pytest.raises(ValueError, match="2 SamplingParams for 1 prompts"):
        llm.generate(["t1"], [SamplingParams(), SamplingParams()])


@pytest.mark.parametrize("args, needle", [
    (["generate", "x", "--temperature", "-1"], "temperature"),
    (["generate", "x", "--top-p", "0"], "top_p"),
    (["generate", "x", "--max-tokens", "0"], "max_tokens"),
    (["generate", "x", "--model", "/nonexistent", "--method", "ar"], "not found"),
])
def test_cli_prints_one_line_and_exits_2(args, needle):
    r = subprocess.run([sys.executable, "-m", "flashtree.cli", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
