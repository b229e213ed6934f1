"""Render an engine round log (`Engine.round_log`) as one self-contained HTML page.

Each round shows its draft tree as inline SVG — every node's token (decoded text) and draft
probability exp(logprob), the accepted path highlighted, the bonus token the target drew after
it — plus τ, the committed text and the round's phase timings. Inline CSS and SVG only: no
scripts, fonts or network. The round data is also embedded as JSON (`#trace-data`) for tools.
This module runs no model; `commands/trace.py` produces the log.
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass

from ..engine.round import PHASES, RoundRecord
from ..engine.sequence import tau_histogram
from ..speculative.proposer import METHODS, proposer_class

COL_W, ROW_H, NODE_W, NODE_H, PAD = 118, 34, 104, 26, 10

CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#1d2330;background:#fafbfc}
h1{font-size:22px;margin:0 0 8px}h2{font-size:16px;margin:0 0 6px}
.summary,.round{background:#fff;border:1px solid #d8dee6;border-radius:8px;padding:14px 16px;margin:0 0 16px}
.kv{display:grid;grid-template-columns:max-content auto;gap:2px 14px}.kv b{color:#556}
pre{white-space:pre-wrap;background:#f3f5f8;border-radius:6px;padding:8px;margin:6px 0;font:13px/1.35 ui-monospace,Menlo,Consolas,monospace}
.r0{background:#dff3e4}.r1{background:#e2ecfb}.prompt{color:#777}
table.times{border-collapse:collapse;font-size:12px;margin:4px 0 8px}
table.times td,table.times th{border:1px solid #e2e6ec;padding:2px 8px;text-align:right}
.tau{display:inline-block;background:#1f7a3a;color:#fff;border-radius:10px;padding:0 8px;font-weight:600}
svg text{font:12px ui-monospace,Menlo,Consolas,monospace}
.legend span{display:inline-block;margin-right:14px}.sw{display:inline-block;width:12px;height:12px;border-radius:3px;vertical-align:-1px;margin-right:4px}
"""


@dataclass(slots=True)
class TraceMeta:
    prompt: str
    output: str
    method: str
    budget: int | str          # an int, or "auto" (each round's draft nodes are its chosen size)
    block_size: int
    temperature: float
    model: str
    draft: str | None
    elapsed_s: float
    completion_tokens: int
    topk: int | None = None   # ddtree branching cap (None: no cap)


def visible(text: str) -> str:
    """Token text with whitespace made visible."""
    return text.replace("\n", "↵").replace("\t", "⇥").replace(" ", "␣") or "∅"


def layout(parents: list[int], depths: list[int]) -> list[float]:
    """Row of every node: leaves take successive rows in pop order, parents centre on children."""
    children = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            children[p].append(i)
    rows, next_row = [0.0] * len(parents), [0]

    def place(i: int) -> float:
        if not children[i]:
            rows[i] = next_row[0]
            next_row[0] += 1
        else:
            ys = [place(c) for c in children[i]]
            rows[i] = (ys[0] + ys[-1]) / 2
        return rows[i]

    place(0)
    return rows


def tree_svg(entry: RoundRecord, decode) -> str:
    tree, path = entry.tree, entry.path
    on_path = set(path)
    rows = layout(tree.parents, tree.depths)
    x = lambda i: PAD + tree.depths[i] * COL_W
    y = lambda r: PAD + r * ROW_H
    last = path[-1]
    bonus_x, bonus_y = PAD + (max(tree.depths) + 1) * COL_W, y(rows[last])
    width = bonus_x + NODE_W + PAD
    height = y(max(rows)) + NODE_H + PAD
    parts = [f'<svg class="tree" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="draft tree of {tree.size} nodes">']
    for i, p in enumerate(tree.parents):  # edges first, under the nodes
        if p >= 0:
            hot = i in on_path and p in on_path
            parts.append(_edge(x(p) + NODE_W, y(rows[p]), x(i), y(rows[i]),
                               "#1f7a3a" if hot else "#b8c0cc", 2.5 if hot else 1))
    parts.append(_edge(x(last) + NODE_W, y(rows[last]), bonus_x, bonus_y, "#d9822b", 2, dash=True))
    for i, tok in enumerate(tree.tokens):
        text = decode([tok])
        prob = "root" if i == 0 else f"{100 * math.exp(tree.logprobs[i]):.1f}%"
        cls = "node accepted" if i in on_path else "node rejected"
        fill, stroke = ("#c9f0d3", "#1f7a3a") if i in on_path else ("#ffffff", "#9aa4b2")
        parts.append(_node(x(i), y(rows[i]), visible(text), prob, fill, stroke, cls,
                           f"node {i}, depth {tree.depths[i]}, token id {tok}, text {text!r}, draft p {prob}"))
    btext = decode([entry.bonus])
    parts.append(_node(bonus_x, bonus_y, visible(btext), "bonus", "#fde7cf", "#d9822b", "node bonus",
                       f"bonus token id {entry.bonus}, text {btext!r} (drawn by the target)"))
    parts.append("</svg>")
    return "".join(parts)


def _edge(x1, y1, x2, y2, color, w, dash=False) -> str:
    y1, y2 = y1 + NODE_H / 2, y2 + NODE_H / 2
    mid = (x1 + x2) / 2
    d = ' stroke-dasharray="5 3"' if dash else ""
    return (f'<path d="M{x1:.0f},{y1:.0f} C{mid:.0f},{y1:.0f} {mid:.0f},{y2:.0f} {x2:.0f},{y2:.0f}" '
            f'fill="none" stroke="{color}" stroke-width="{w}"{d}/>')


def _node(x, y, label, prob, fill, stroke, cls, title) -> str:
    short = label if len(label) <= 8 else label[:7] + "…"
    return (f'<g class="{cls}"><title>{html.escape(title)}</title>'
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{NODE_W}" height="{NODE_H}" rx="5" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="1.5"/>'
            f'<text x="{x + 6:.0f}" y="{y + 17:.0f}">{html.escape(short)}</text>'
            f'<text x="{x + NODE_W - 6:.0f}" y="{y + 17:.0f}" text-anchor="end" fill="#667">{prob}</text></g>')


def histogram_svg(taus: list[int], block_size: int) -> str:
    counts = tau_histogram(taus, block_size)
    n = len(counts)
    top, bw, h = max(counts, default=1) or 1, 26, 90
    bars = "".join(
        f'<rect x="{8 + k * bw}" y="{18 + h - h * c / top:.0f}" width="{bw - 4}" height="{h * c / top:.0f}" '
        f'fill="#3b7dd8"><title>tau={k + 1}: {c} rounds</title></rect>'
        f'<text x="{8 + k * bw + (bw - 4) / 2:.0f}" y="{h + 32}" text-anchor="middle">{k + 1}</text>'
        f'<text x="{8 + k * bw + (bw - 4) / 2:.0f}" y="{14 + h - h * c / top:.0f}" text-anchor="middle" '
        f'fill="#556">{c}</text>'
        for k, c in enumerate(counts))
    return (f'<svg class="hist" xmlns="http://www.w3.org/2000/svg" width="{16 + n * bw}" height="{h + 38}">'
            f'{bars}</svg>')


def times_table(times: dict[str, float]) -> str:
    keys = [k for k in PHASES if k in times] + sorted(k for k in times if k not in PHASES)
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys) + "<th>total</th>"
    cells = "".join(f"<td>{1e3 * times[k]:.2f}</td>" for k in keys) + f"<td>{1e3 * sum(times.values()):.2f}</td>"
    return f'<table class="times"><tr><th>ms</th>{head}</tr><tr><td></td>{cells}</tr></table>'


def render(rounds: list[RoundRecord], decode, meta: TraceMeta) -> str:
    """The whole page: a summary, then one <section class="round"> per logged round."""
    taus = [e.tau for e in rounds]
    total: dict[str, float] = {}
    for e in rounds:
        for k, v in _times(e).items():
            total[k] = total.get(k, 0.0) + v
    colored = "".join(f'<span class="r{i % 2}" title="round {i + 1}, tau {e.tau}">'
                      f'{html.escape(decode(e.committed))}</span>' for i, e in enumerate(rounds))
    mean_tau = sum(taus) / len(taus) if taus else 0.0
    opts = proposer_class(meta.method).options if meta.method in METHODS else ()
    kv = [("method", meta.method), ("budget", meta.budget if "budget" in opts else "-"),
          ("topk", (meta.topk if meta.topk is not None else "no cap") if "topk" in opts else "-"),
          ("block size", meta.block_size), ("temperature", f"{meta.temperature:g}"),
          ("target", meta.model), ("drafter", meta.draft or "-"), ("rounds", len(rounds)),
          ("mean τ", f"{mean_tau:.2f}"), ("tokens", meta.completion_tokens),
          ("elapsed", f"{meta.elapsed_s:.3f} s ({meta.completion_tokens / max(meta.elapsed_s, 1e-9):.1f} tok/s)")]
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>flashtree trace: {html.escape(meta.method)}, {len(rounds)} rounds</title>",
           f"<style>{CSS}</style></head><body>",
           '<section class="summary"><h1>flashtree trace</h1><div class="kv">',
           "".join(f"<b>{html.escape(k)}</b><span>{html.escape(str(v))}</span>" for k, v in kv), "</div>",
           "<h2>text</h2>",
           f'<pre><span class="prompt">{html.escape(meta.prompt)}</span>'
           f'{html.escape(_first_token(rounds, decode))}{colored}</pre>',
           "<h2>τ histogram (tokens committed per round, bonus included)</h2>",
           histogram_svg(taus, meta.block_size), "<h2>time per phase, all rounds</h2>", times_table(total),
           '<p class="legend"><span><i class="sw" style="background:#c9f0d3;border:1px solid #1f7a3a"></i>'
           'accepted path</span><span><i class="sw" style="background:#fff;border:1px solid #9aa4b2"></i>'
           'rejected draft</span><span><i class="sw" style="background:#fde7cf;border:1px solid #d9822b"></i>'
           'bonus (the target\'s own token)</span><span>percentages: draft probability of the node\'s token'
           '</span></p></section>']
    for n, e in enumerate(rounds, 1):
        predicted = f' (predicted {e.predicted_tau:.2f})' if e.predicted_tau is not None else ""
        out.append(f'<section class="round" id="round-{n}" data-tau="{e.tau}" data-nodes="{e.tree.size}">'
                   f'<h2>Round {n} <span class="tau">τ = {e.tau}</span>{predicted} · {e.tree.size - 1} draft nodes · '
                   f'{e.tau - 1} accepted · bonus <code>{html.escape(visible(decode([e.bonus])))}</code></h2>'
                   f'<div>committed: <code>{html.escape(visible(decode(e.committed)))}</code></div>'
                   f'{times_table(_times(e))}{tree_svg(e, decode)}</section>')
    out.append(f'<script type="application/json" id="trace-data">{_data_json(rounds, meta)}</script>')
    out.append("</body></html>")
    return "\n".join(out)


def _times(e: RoundRecord) -> dict[str, float]:
    return e.times.as_dict() if e.times is not None else {}


def _first_token(rounds: list[RoundRecord], decode) -> str:
    """The prefill's token is the root of the first round."""
    return decode([rounds[0].tree.tokens[0]]) if rounds else ""


def _data_json(rounds: list[RoundRecord], meta: TraceMeta) -> str:
    data = {"meta": {k: getattr(meta, k) for k in TraceMeta.__slots__},
            "rounds": [{"tau": e.tau, "predicted_tau": e.predicted_tau, "path": e.path,
                        "bonus": e.bonus, "times": _times(e),
                        "tokens": e.tree.tokens, "parents": e.tree.parents,
                        "depths": e.tree.depths, "logprobs": e.tree.logprobs} for e in rounds]}
    return json.dumps(data).replace("</", "<\\/")
