"""The target's features for every training row, computed once and kept on disk.

A drafter training step needs the tapped target layers' hidden states for its batch. Running the
target for them every step is most of a step's cost on a CPU (28 of SmolLM2's 30 layers over
~2,400 tokens against a two-layer drafter), and they are the same every epoch. `FeatureStore`
runs the target once over all rows and writes the features to one memory-mapped file in the dtype
the engine hands them to the drafter in (the target's `kv_dtype`), so training memory stays
bounded (the file is paged in and out by the OS) however many rows there are. With `topk`, the
same pass keeps the target's own next-token distribution at every position, as its K likeliest
tokens and their log-probabilities (the soft labels of `--distill-topk`; 64 bytes a token at K = 8,
against 5.8 KB of SmolLM2's five tapped layers). Building resumes where it stopped; a store built
for other layers, dtype or rows is rebuilt, unless the new rows only add to the old ones (a larger data set): then the
built rows are kept. It does not choose rows or batches — the training loop does.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

# the target's dtype as stored: bfloat16 as its raw 16 bits (numpy has no bfloat16)
_STORED = {torch.bfloat16: (np.uint16, torch.int16), torch.float16: (np.float16, None),
           torch.float32: (np.float32, None)}


def rows_digest(rows: list[dict]) -> str:
    """A fingerprint of the rows' token ids, in order: a store is reused only for the same rows."""
    h = hashlib.sha256()
    for r in rows:
        h.update(np.asarray(r["ids"], dtype=np.int64).tobytes() + b"|")
    return h.hexdigest()[:32]


def _extends(meta: dict, want: dict, offsets: np.ndarray, rows: list[dict]) -> bool:
    """Whether a store built as `meta` holds a prefix of `rows`: same layers, dtype and width,
    fewer rows, and those rows the first of `rows`; with the same top-k, or none wanted (the
    grown store then drops the top-k it had)."""
    same = (all(meta.get(k) == want[k] for k in ("layers", "dtype", "width"))
            and want.get("topk", 0) in (0, meta.get("topk", 0)))
    n = meta.get("rows", 0)
    return (same and 0 < n < len(rows) and meta.get("tokens") == int(offsets[n])
            and meta.get("digest") == rows_digest(rows[:n]))


@dataclass
class FeatureStore:
    offsets: np.ndarray   # [rows + 1]: row i's features are data[offsets[i]:offsets[i+1]]
    data: np.memmap       # [tokens, F]
    dtype: torch.dtype    # as the engine hands them to the drafter (the target's kv_dtype)
    top_ids: np.memmap | None = None    # [tokens, K] int32: the target's K likeliest next tokens at each position
    top_logp: np.memmap | None = None   # [tokens, K] float32: their log-probabilities (full softmax)

    @classmethod
    def build(cls, target, rows: list[dict], layers: list[int], path: Path, batch_tokens: int = 4096,
              topk: int = 0) -> FeatureStore:
        """Features of `rows` ({"ids": [...]}) at target `layers`, written to `path` (+ .json), and
        with `topk` > 0 the target's top-k next tokens (`path` + .topk-ids / .topk-logp). A store
        built without top-k is rebuilt when top-k is asked for; one built with it and grown without
        it keeps its features and drops the top-k."""
        dtype = target.kv_dtype  # the features' dtype as the engine hands them to the drafter
        width = len(layers) * target.config.hidden_size
        lengths = np.array([len(r["ids"]) for r in rows], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        meta_path = path.with_suffix(".json")
        want = {"layers": list(layers), "dtype": str(dtype), "rows": len(rows), "tokens": int(offsets[-1]),
                "width": width, "digest": rows_digest(rows)}
        if topk:
            want["topk"] = topk
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() and path.is_file() else {}
        np_dtype, view = _STORED[dtype]
        fresh = {k: meta.get(k) for k in want} != want
        if fresh and _extends(meta, want, offsets, rows):  # more rows after the same ones: keep what is built
            with path.open("r+b") as f:
                f.truncate(int(offsets[-1]) * width * np.dtype(np_dtype).itemsize)
            for suffix in (".topk-ids", ".topk-logp"):  # int32 / float32: 4 bytes each
                if topk:
                    with path.with_name(path.name + suffix).open("r+b") as f:
                        f.truncate(int(offsets[-1]) * topk * 4)
                else:
                    path.with_name(path.name + suffix).unlink(missing_ok=True)
            fresh = False
        data = np.memmap(path, dtype=np_dtype, mode="w+" if fresh else "r+", shape=(int(offsets[-1]), width))
        top_ids = top_logp = None
        if topk:
            top_ids, top_logp = (np.memmap(path.with_name(path.name + suffix), dtype=t, mode="w+" if fresh else "r+",
                                           shape=(int(offsets[-1]), topk))
                                 for suffix, t in ((".topk-ids", np.int32), (".topk-logp", np.float32)))
        done = 0 if fresh else int(meta.get("done", 0))
        # rows in chunks, each chunk's rows batched by length so little is padding
        chunk = 256
        bar = tqdm(total=len(rows), initial=done, desc="features", dynamic_ncols=True)
        with torch.inference_mode():
            while done < len(rows):
                idx = sorted(range(done, min(done + chunk, len(rows))), key=lambda i: lengths[i])
                while idx:
                    n = 1  # ascending lengths: grow the batch while its padded size fits batch_tokens
                    while n < len(idx) and (n + 1) * lengths[idx[n]] <= batch_tokens:
                        n += 1
                    take, idx = idx[:n], idx[n:]
                    T = int(lengths[take[-1]])
                    ids = torch.zeros(len(take), T, dtype=torch.long)
                    for b, i in enumerate(take):
                        ids[b, :lengths[i]] = torch.tensor(rows[i]["ids"])
                    hidden, feats = target(ids, torch.arange(T).expand_as(ids), feature_layers=list(layers))
                    if topk:
                        top = torch.log_softmax(target.logits(hidden).float(), -1).topk(topk, -1)  # [N, T, K]
                    for b, i in enumerate(take):  # right padding: causal rows before it are unaffected
                        f = feats[b, :lengths[i]].to(dtype).contiguous()
                        data[offsets[i]:offsets[i + 1]] = (f.view(view) if view else f).numpy()
                        if topk:
                            top_ids[offsets[i]:offsets[i + 1]] = top.indices[b, :lengths[i]].int().numpy()
                            top_logp[offsets[i]:offsets[i + 1]] = top.values[b, :lengths[i]].numpy()
                    bar.update(len(take))
                done = min(done + chunk, len(rows))
                for m in (data, top_ids, top_logp):
                    if m is not None:
                        m.flush()
                meta_path.write_text(json.dumps({**want, "done": done}) + "\n")
        bar.close()
        return cls(offsets, data, dtype, top_ids, top_logp)

    def batch(self, index: list[int], T: int) -> torch.Tensor:
        """Features of rows `index`, zero-padded to T tokens: [N, T, F] float32."""
        out = torch.zeros(len(index), T, self.data.shape[1])
        for b, i in enumerate(index):
            raw = torch.from_numpy(np.asarray(self.data[self.offsets[i]:self.offsets[i + 1]]))
            rows = raw.view(torch.bfloat16) if self.dtype == torch.bfloat16 else raw
            out[b, :len(rows)] = rows.float()
        return out

    def teacher(self, index: list[int], T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's top-k next tokens of rows `index` and their probabilities renormalised over
        the k, zero-padded to T tokens: ([N, T, K] long, [N, T, K] float32)."""
        if self.top_ids is None:
            raise ValueError("this store was built without topk")
        K = self.top_ids.shape[1]
        ids, probs = torch.zeros(len(index), T, K, dtype=torch.long), torch.zeros(len(index), T, K)
        for b, i in enumerate(index):
            lo, hi = self.offsets[i], self.offsets[i + 1]
            ids[b, :hi - lo] = torch.from_numpy(np.asarray(self.top_ids[lo:hi])).long()
            probs[b, :hi - lo] = torch.softmax(torch.from_numpy(np.asarray(self.top_logp[lo:hi])), -1)
        return ids, probs
