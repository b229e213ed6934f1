"""Training-loop plumbing shared by `train-target` and `train-drafter`.

A resumable checkpoint (model, optimiser, step and the hours spent so far), the JSONL loss log
next to it, and the warmup + cosine learning-rate schedule. It does not own the models, the data
or the optimisation step; each trainer keeps those.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import UserError


def warmup_cosine(step: int, total: int, peak: float, warmup: int, floor: float = 0.0) -> float:
    """Linear warmup to `peak` over `warmup` steps, then cosine down to `floor * peak` at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac)))


@dataclass(slots=True)
class TrainState:
    """Where a training run stands: `step`, hours spent across resumes, checkpoint and log files."""
    ckpt: Path
    log_path: Path
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    step: int = 0
    hours_before: float = 0.0
    t0: float = field(default_factory=time.time)

    @classmethod
    def open(cls, work: Path, name: str, model, opt, resume: bool) -> TrainState:
        """State for `work/<name>_ckpt.pt`; with `resume`, load it when it exists. Starting over
        on top of an existing checkpoint is refused rather than silently overwriting it."""
        state = cls(work / f"{name}_ckpt.pt", work / f"{name}_log.jsonl", model, opt)
        if state.ckpt.is_file() and not resume:
            raise UserError(f"{state.ckpt} already holds a training run: pass --resume to continue it, "
                             "or remove it (or choose another --work) to start over")
        if resume and state.ckpt.is_file():
            saved = torch.load(state.ckpt, weights_only=True)
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
            state.step, state.hours_before = saved["step"], saved.get("hours", 0.0)
        return state

    @property
    def hours(self) -> float:
        return self.hours_before + (time.time() - self.t0) / 3600

    def minutes_this_run(self) -> float:
        return (time.time() - self.t0) / 60

    def save(self) -> None:
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                    "hours": self.hours}, self.ckpt)

    def log(self, **fields) -> None:
        with self.log_path.open("a") as f:
            f.write(json.dumps({"step": self.step, **fields, "elapsed_h": self.hours}) + "\n")
