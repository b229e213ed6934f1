"""Model configurations parsed from HF `config.json` files.

`ModelConfig` covers the decoder-only targets flashtree runs (qwen3, llama, qwen2);
`DrafterConfig` is the z-lab DFlash drafter format. Both are validated on construction and
name the file and field when something is wrong. Nothing here touches weights.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("qwen3", "llama", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class ConfigError(ValueError):
    """A model directory or config that flashtree cannot load."""


DRAFT_VOCAB_FILE = "draft_vocab.json"  # a drafter directory's reduced draft vocabulary (optional)


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None


def _rope_settings(raw: dict) -> tuple[float, dict]:
    """(rope_theta, scaling dict) from either the transformers 4.x or 5.x layout."""
    params = dict(raw.get("rope_parameters") or {})
    scaling = dict(raw.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    merged = {**params, **scaling}
    merged.pop("rope_theta", None)
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    merged["rope_type"] = rope_type
    return theta, merged


def _refuse_sliding_window(raw: dict, source: str) -> None:
    """Every layer must be full causal attention: a sliding-window layer run over the whole context
    would decode differently from the checkpoint, so it is refused rather than run wrongly."""
    n = raw.get("num_hidden_layers") or 0
    types = raw.get("layer_types")
    if types is not None:
        if len(types) != n:
            raise ConfigError(f"{source}: field 'layer_types' lists {len(types)} layers but "
                              f"num_hidden_layers is {n}")
        other = sorted({t for t in types if t != "full_attention"})
        if other:
            layers = [i for i, t in enumerate(types) if t != "full_attention"]
            raise ConfigError(f"{source}: field 'layer_types' has {', '.join(map(repr, other))} at layer(s) "
                              f"{layers} (sliding_window {raw.get('sliding_window')}); flashtree runs only "
                              "'full_attention' layers and refuses to run a windowed layer as full attention")
        return
    # transformers' qwen2/qwen3 rule when layer_types is absent: layers >= max_window_layers slide
    window, first = raw.get("sliding_window", 4096), raw.get("max_window_layers", 28)
    if raw.get("model_type") in ("qwen2", "qwen3") and raw.get("use_sliding_window") and window is not None \
            and first < n:
        raise ConfigError(f"{source}: field 'use_sliding_window' is true with 'sliding_window' {window} "
                          f"(layers {first}..{n - 1}, from 'max_window_layers'); flashtree runs only full "
                          "attention and refuses to run a windowed layer as full attention")


@dataclass(slots=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict = field(default_factory=lambda: {"rope_type": "default"})
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    source: str = "<config>"

    def __post_init__(self):
        def bad(name, why):
            raise ConfigError(f"{self.source}: field '{name}' {why}")

        if self.model_type not in SUPPORTED_MODEL_TYPES:
            bad("model_type", f"is '{self.model_type}'; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            if int(getattr(self, name)) < 1:
                bad(name, f"must be a positive integer, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            bad("num_key_value_heads", f"({self.num_key_value_heads}) must divide num_attention_heads "
                f"({self.num_attention_heads})")
        if self.rope_scaling.get("rope_type") not in SUPPORTED_ROPE_TYPES:
            bad("rope_scaling", f"type '{self.rope_scaling.get('rope_type')}' is not supported; "
                f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")

    @classmethod
    def from_dict(cls, raw: dict, source: str = "<config>") -> ModelConfig:
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(f"{source}: field 'model_type' is '{model_type}'; supported: "
                              f"{', '.join(SUPPORTED_MODEL_TYPES)}")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in raw]
        if missing:
            raise ConfigError(f"{source}: missing field(s) {', '.join(missing)}")
        _refuse_sliding_window(raw, source)
        theta, scaling = _rope_settings(raw)
        heads = raw["num_attention_heads"]
        return cls(
            model_type=model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # qwen2 always has q/k/v biases; llama and qwen3 follow `attention_bias`.
            attention_bias=True if model_type == "qwen2" else bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            source=source,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if not path.is_dir():
            raise ConfigError(f"{path}: model directory not found")
        return cls.from_dict(read_json(path / "config.json"), source=str(path / "config.json"))


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab DFlash's default feature layers: one per drafter layer, the middle layer for a
    1-layer drafter, else evenly spaced over [1, L-3]. Never the last layer (SPEC §2): for
    targets under 4 layers, where z-lab's rule can give L-1 or a negative id, ids are clamped
    into [0, L-2]."""
    if num_target_layers < 2:
        raise ConfigError(f"a {num_target_layers}-layer target has no layer but the last to take features from")
    if num_draft_layers == 1:
        ids = [num_target_layers // 2]
    else:
        start, end = 1, num_target_layers - 3
        ids = [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]
    return [min(max(i, 0), num_target_layers - 2) for i in ids]


@dataclass(slots=True)
class DrafterConfig:
    """z-lab DFlash drafter: Qwen3 layers + `fc`/`hidden_norm` over target features."""
    layers: ModelConfig  # the Qwen3 layer fields (vocab/hidden must match the target)
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    num_target_layers: int | None = None
    source: str = "<config>"
    # the target token ids it drafts from (`draft_vocab.json` beside config.json, EAGLE-3's and
    # FR-Spec's reduced draft vocabulary: its LM head reads only these rows); None: every token
    draft_vocab: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.block_size < 2:
            raise ConfigError(f"{self.source}: field 'block_size' must be >= 2, got {self.block_size}")
        if not self.target_layer_ids:
            raise ConfigError(f"{self.source}: field 'dflash_config.target_layer_ids' is empty")

    @classmethod
    def from_dict(cls, raw: dict, source: str = "<config>") -> DrafterConfig:
        archs = raw.get("architectures") or []
        if "DFlashDraftModel" not in archs:
            raise ConfigError(f"{source}: field 'architectures' is {archs}; a DFlash drafter needs "
                              "['DFlashDraftModel']")
        dflash = raw.get("dflash_config") or {}
        if "mask_token_id" not in dflash:
            raise ConfigError(f"{source}: missing field 'dflash_config.mask_token_id'")
        if "block_size" not in raw:
            raise ConfigError(f"{source}: missing field 'block_size'")
        layers = ModelConfig.from_dict({**raw, "model_type": "qwen3"}, source=source)
        ids = dflash.get("target_layer_ids")
        if ids is None:  # z-lab falls back to build_target_layer_ids(num_target_layers, num_hidden_layers)
            if raw.get("num_target_layers") is None:
                raise ConfigError(f"{source}: field 'dflash_config.target_layer_ids' is missing and so is "
                                  "'num_target_layers', which its default is built from")
            ids = build_target_layer_ids(int(raw["num_target_layers"]), layers.num_hidden_layers)
        return cls(layers=layers, block_size=int(raw["block_size"]),
                   mask_token_id=int(dflash["mask_token_id"]),
                   target_layer_ids=[int(i) for i in ids],
                   num_target_layers=raw.get("num_target_layers"), source=source)

    @classmethod
    def from_dir(cls, path: str | Path) -> DrafterConfig:
        path = Path(path)
        if not path.is_dir():
            raise ConfigError(f"{path}: drafter directory not found")
        cfg = cls.from_dict(read_json(path / "config.json"), source=str(path / "config.json"))
        vocab = path / DRAFT_VOCAB_FILE
        if vocab.is_file():
            ids = read_json(vocab).get("token_ids")
            if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids) \
                    or len(set(ids)) != len(ids):
                raise ConfigError(f"{vocab}: field 'token_ids' must be a non-empty list of distinct token ids")
            cfg.draft_vocab = tuple(ids)
        return cfg

    def check_pair(self, target: ModelConfig) -> None:
        """Refuse a drafter that cannot run on this target, naming both files and the field."""
        def bad(name, mine, theirs):
            raise ConfigError(f"drafter {self.source} and target {target.source} do not match: "
                              f"'{name}' is {mine} in the drafter but {theirs} in the target")

        if self.layers.vocab_size != target.vocab_size:
            bad("vocab_size", self.layers.vocab_size, target.vocab_size)
        if self.layers.hidden_size != target.hidden_size:
            bad("hidden_size", self.layers.hidden_size, target.hidden_size)
        if not 0 <= self.mask_token_id < target.vocab_size:
            bad("dflash_config.mask_token_id", self.mask_token_id, f"vocab_size {target.vocab_size}")
        if self.draft_vocab is not None and not all(0 <= i < target.vocab_size for i in self.draft_vocab):
            bad(DRAFT_VOCAB_FILE + " token_ids", "ids outside the vocabulary", f"vocab_size {target.vocab_size}")
        out_of_range = [i for i in self.target_layer_ids if not 0 <= i < target.num_hidden_layers]
        if out_of_range:
            bad("dflash_config.target_layer_ids", self.target_layer_ids,
                f"num_hidden_layers {target.num_hidden_layers} (ids {out_of_range} out of range)")

    def to_dict(self) -> dict:
        c = self.layers
        return {
            "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
            "block_size": self.block_size, "num_target_layers": self.num_target_layers,
            "dflash_config": {"mask_token_id": self.mask_token_id,
                              "target_layer_ids": list(self.target_layer_ids)},
            "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
            "max_position_embeddings": c.max_position_embeddings, "attention_bias": False,
            "tie_word_embeddings": False, "hidden_act": "silu",
            "layer_types": ["full_attention"] * c.num_hidden_layers, "torch_dtype": "float32",
        }
