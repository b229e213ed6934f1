"""Tiny random checkpoints for tests: HF targets written by transformers, DFlash drafters by flashtree."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from flashtree.config import DrafterConfig, ModelConfig
from flashtree.models.drafter import DFlashDrafter
from flashtree.models.loader import load_target, save_module
from flashtree.speculative.costs import CostTable

BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def make_hf_target(path: Path, model_type: str = "qwen3", seed: int = 0, random_vectors: bool = True,
                   **over) -> Path:
    """Save a random transformers model (float32) with `save_pretrained` and return its dir.

    Every bias and every RMSNorm weight (layer norms, qwen3 q_norm/k_norm, the final norm) is
    random too (`random_vectors`): at HF's init (zeros / ones) a dropped bias or a misapplied
    norm weight would leave the logits unchanged and parity tests could not see it."""
    import transformers
    cfg_cls = {"qwen3": transformers.Qwen3Config, "llama": transformers.LlamaConfig,
               "qwen2": transformers.Qwen2Config}[model_type]
    kw = {**BASE, **over}
    if model_type == "qwen3":
        kw.setdefault("head_dim", 16)
    cfg = cfg_cls(**kw)
    model_cls = {"qwen3": transformers.Qwen3ForCausalLM, "llama": transformers.LlamaForCausalLM,
                 "qwen2": transformers.Qwen2ForCausalLM}[model_type]
    torch.manual_seed(seed)
    model = model_cls(cfg).float()
    with torch.no_grad():  # larger weights than the 0.02 init make logits far from uniform
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2 if "embed" in name or "lm_head" in name else 0.08)
            elif random_vectors and name.endswith(".bias"):
                p.normal_(0, 0.2)
            elif random_vectors and "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path, safe_serialization=True)
    return path


def make_drafter(path: Path, target_dir: Path, block_size: int = 8, layers: int = 1,
                 target_layer_ids=(0, 2), mask_token_id: int | None = None, seed: int = 1) -> Path:
    t = ModelConfig.from_dir(target_dir)
    raw = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": block_size,
        "num_target_layers": t.num_hidden_layers,
        "dflash_config": {"mask_token_id": t.vocab_size - 1 if mask_token_id is None else mask_token_id,
                          "target_layer_ids": list(target_layer_ids)},
        "vocab_size": t.vocab_size, "hidden_size": t.hidden_size, "intermediate_size": t.intermediate_size,
        "num_hidden_layers": layers, "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": t.num_key_value_heads, "head_dim": t.head_dim, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "max_position_embeddings": t.max_position_embeddings,
    }
    cfg = DrafterConfig.from_dict(raw, source=str(path / "config.json"))
    torch.manual_seed(seed)
    model = DFlashDrafter(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.1)
    save_module(model, raw, path)
    return path


def write_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level tokenizer over tokens 't0'..'t{V-1}' so LLM() can load test checkpoints."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}))


def repetitive_prompts(n: int = 16, seed: int = 0) -> list[list[int]]:
    """Token prompts over V=96, every other one a repeated random phrase (n-gram drafts find copies)."""
    import random
    rng = random.Random(seed)
    out = []
    for i in range(n):
        base = [rng.randrange(0, 95) for _ in range(rng.randint(1, 12))]
        out.append(base * rng.randint(2, 4) if i % 2 else base)
    return out


def cost_table(fn, batches=(1,), widths=(1, 2, 4, 8, 16, 32, 64), draft=0.0, learn=True) -> CostTable:
    """A cost table of fn(batch, tokens) seconds a target forward and `draft` seconds a drafter
    pass; `learn=False` pins it (auto's choices then do not depend on this machine's timings)."""
    c = CostTable(learn=learn)
    for b in batches:
        for t in widths:
            c.record_verify(b, t, fn(b, t))
        c.record_draft(b, draft)
    return c


def pin(fn, draft=3e-4, batches=(1, 2, 4, 512)):
    """A patch pinning the engine's costs to fn(batch, tokens) seconds (no online refresh): the
    choices become deterministic. Set through the engine's public cost table."""
    def patch(eng):
        eng.adaptive.costs = cost_table(fn, batches, draft=draft, learn=False)
    return patch


def near_tie_gap(model, prompt: list[int], a: list[int], b: list[int]) -> float:
    """The float64 logit gap between the two tokens where greedy outputs a and b first differ.

    Two greedy runs in one float dtype may part where the best two logits tie to within rounding
    (a verify of T rows sums in another order than a one-row step); a small gap says that is all."""
    i = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
    target = load_target(model, dtype="float64", device="cpu")
    ids = torch.tensor([prompt + a[:i]])
    with torch.no_grad():
        logits = target.logits(target(ids, torch.arange(ids.shape[1])[None])[0][0, -1])
    return abs(float(logits[a[i]] - logits[b[i]]))
