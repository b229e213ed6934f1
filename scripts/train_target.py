"""Train (or resume) the bundled target: python scripts/train_target.py [--resume] [--max-minutes M]."""
import argparse
from pathlib import Path

from flashtree.train.target import TargetRecipe, train_target

p = argparse.ArgumentParser()
p.add_argument("--out", default="models/target")
p.add_argument("--work", default="runs/target")
p.add_argument("--steps", type=int, default=TargetRecipe().steps)
p.add_argument("--resume", action="store_true")
p.add_argument("--max-minutes", type=float, default=None)
p.add_argument("--threads", type=int, default=None, help="torch threads (1 is robust on a shared 2-core machine)")
a = p.parse_args()
if a.threads:
    import torch
    torch.set_num_threads(a.threads)
print(train_target(Path(a.out), Path(a.work), TargetRecipe(steps=a.steps), a.resume, a.max_minutes))
