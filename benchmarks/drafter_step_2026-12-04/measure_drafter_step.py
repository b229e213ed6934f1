"""One drafter training step on SmolLM2, fp32 against bf16 autocast, by phase (needs the run's
work dir runs/smollm2-drafter/work: its data and feature file). Usage: python benchmarks/drafter_step_2026-12-04/measure_drafter_step.py"""
import json
import time

import numpy as np
import torch
import torch.nn.functional as F

from flashtree.models.loader import load_drafter, load_target
from flashtree.models.registry import resolve
from flashtree.train.drafter import DrafterRecipe, block_batch, draw_anchors, usable
from flashtree.train.features import FeatureStore

torch.set_num_threads(2)

tdir = resolve("smollm2-135m-instruct", None).target
target = load_target(tdir, dtype="auto", device="cpu")
drafter = load_drafter("training/smollm2-135m-instruct-drafter/drafter", target).float().train().requires_grad_(True)
rows = usable([json.loads(line) for line in open("runs/smollm2-drafter/work/regenerated.jsonl")][:2000], 8)
recipe = DrafterRecipe(block_size=8, anchors=16, batch_size=8, num_layers=2, target_layer_ids=[1,27])
store = FeatureStore.build(target, rows, [1,27], __import__("pathlib").Path("runs/smollm2-drafter/work/features-1-27.bin"))
head = target.lm_head.weight.float()
rng = np.random.default_rng(0)
opt = torch.optim.AdamW(drafter.parameters(), lr=1e-4)
for mode in ["fp32", "bf16", "fp32", "bf16"]:
    ts = {}
    for it in range(3):
        t = {}
        t0 = time.perf_counter()
        index = rng.integers(0, len(rows), 8).tolist()
        batch = [rows[i] for i in index]
        ids, block_ids, block_pos, labels, mask = block_batch(batch, recipe, 16, draw_anchors(batch, recipe, rng))
        feats = store.batch(index, ids.shape[1])
        t["data"] = time.perf_counter() - t0
        with torch.no_grad():
            embeds = target.model.embed_tokens(block_ids).float()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(mode == "bf16")):
            hidden = drafter(embeds, block_pos, feats, torch.arange(ids.shape[1]).expand_as(ids), mask=mask)
            t["drafter_fwd"] = time.perf_counter() - t0 - sum(t.values())
            logits = F.linear(hidden, head)
        t["head"] = time.perf_counter() - t0 - sum(t.values())
        ce = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        t["ce"] = time.perf_counter() - t0 - sum(t.values())
        opt.zero_grad()
        ce.backward()
        t["bwd"] = time.perf_counter() - t0 - sum(t.values())
        opt.step()
        t["opt"] = time.perf_counter() - t0 - sum(t.values())
        if it:
            for k, v in t.items():
                ts[k] = ts.get(k, 0) + v / 2
    print(mode, {k: round(v, 3) for k, v in ts.items()}, "total", round(sum(ts.values()), 3), "T", ids.shape[1], flush=True)
