"""Train the bundled target LM (a small qwen3-format model) on the stdlib corpus.

`flashtree train-target --out DIR`: builds the tokenizer, tokenises the training split, trains
with AdamW + cosine under a progress bar, checkpoints every `--ckpt-every` steps (resumable with
`--resume`), and exports an HF directory (config.json, model.safetensors, tokenizer files,
generation_config.json) that flashtree and transformers both load.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..config import ModelConfig
from ..models.loader import save_module
from ..models.target import TargetModel
from .corpus import read_source, stdlib_files
from .loop import TrainState, warmup_cosine
from .tokenizer import EOS, save_tokenizer, train_tokenizer


@dataclass(slots=True)
class TargetRecipe:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    seq_len: int = 256
    batch_size: int = 16
    steps: int = 1100
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.1
    seed: int = 0

    def model_config(self) -> dict:
        return {
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.hidden_size // self.num_attention_heads, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "max_position_embeddings": 2048, "tie_word_embeddings": True,
            "attention_bias": False, "hidden_act": "silu", "bos_token_id": None, "eos_token_id": 0,
            "torch_dtype": "float32",
        }


def tokenize_files(tok, files) -> np.ndarray:
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch([read_source(p) for p in files]):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def lr_at(step: int, r: TargetRecipe) -> float:
    return warmup_cosine(step, r.steps, r.lr, r.warmup, floor=0.1)


def prepare_data(work: Path, recipe: TargetRecipe):
    """Tokenizer + token arrays (train / held-out), cached under `work`."""
    from tokenizers import Tokenizer
    tok_dir = work / "tokenizer"
    if not (tok_dir / "tokenizer.json").is_file():
        train_files, _ = stdlib_files()
        tok = train_tokenizer((read_source(p) for p in train_files), recipe.vocab_size)
        save_tokenizer(tok, tok_dir)
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    arrays = {}
    for split, idx in (("train", 0), ("heldout", 1)):
        f = work / f"{split}_tokens.npy"
        if not f.is_file():
            np.save(f, tokenize_files(tok, stdlib_files()[idx]))
        arrays[split] = np.load(f)
    return tok, arrays


@torch.no_grad()
def perplexity(model, tokens: np.ndarray, seq_len: int, max_windows: int = 64) -> float:
    n = min(max_windows, (len(tokens) - 1) // seq_len)
    x = torch.from_numpy(tokens[: n * seq_len + 1].astype(np.int64))
    inp, tgt = x[:-1].view(n, seq_len), x[1:].view(n, seq_len)
    pos = torch.arange(seq_len).expand(n, -1)
    total = 0.0
    for i in range(0, n, 8):
        h, _ = model(inp[i:i + 8], pos[i:i + 8])
        total += F.cross_entropy(model.logits(h).flatten(0, 1), tgt[i:i + 8].flatten(), reduction="sum").item()
    return math.exp(total / (n * seq_len))


def train_target(out: Path, work: Path, recipe: TargetRecipe, resume: bool = False,
                 max_minutes: float | None = None) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(recipe.seed)
    cfg = ModelConfig.from_dict(recipe.model_config(), source=str(out / "config.json"))
    model = TargetModel(cfg)
    for _name, p in model.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95),
                            weight_decay=recipe.weight_decay)
    state = TrainState.open(work, "target", model, opt, resume)  # refuses before the long data work
    tok, data = prepare_data(work, recipe)
    rng = np.random.default_rng(recipe.seed + state.step)
    train = data["train"]
    pos = torch.arange(recipe.seq_len).expand(recipe.batch_size, -1)
    bar = tqdm(total=recipe.steps, initial=state.step, desc="train-target", dynamic_ncols=True)

    model.train()
    while state.step < recipe.steps:
        starts = rng.integers(0, len(train) - recipe.seq_len - 1, recipe.batch_size)
        batch = torch.from_numpy(np.stack([train[s:s + recipe.seq_len + 1] for s in starts]).astype(np.int64))
        for g in opt.param_groups:
            g["lr"] = lr_at(state.step, recipe)
        h, _ = model(batch[:, :-1], pos)
        loss = F.cross_entropy(model.logits(h).flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state.step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if state.step % 20 == 0:
            state.log(loss=loss.item(), lr=lr_at(state.step, recipe))
        if state.step % 100 == 0:
            state.save()
        if max_minutes and state.minutes_this_run() > max_minutes:
            break
    bar.close()
    state.save()
    model.eval()
    ppl = perplexity(model, data["heldout"], recipe.seq_len)
    export_target(model, recipe, work, out)
    report = {"steps": state.step, "heldout_ppl": ppl, "train_hours": state.hours,
              "params": sum(p.numel() for p in model.parameters()), "recipe": asdict(recipe)}
    (out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def export_target(model: TargetModel, recipe: TargetRecipe, work: Path, out: Path) -> None:
    save_module(model, recipe.model_config(), out, skip=("lm_head.weight",))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((work / "tokenizer" / name).read_bytes())
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 0, "do_sample": False}) + "\n")
