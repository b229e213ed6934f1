"""What `flashtree bench` prints and writes from its report: the terminal table, report.md and the
plots (speedup against budget, the accept-length histograms, tok/s against concurrency).

It renders a finished report (`bench.summarize_group`'s cells, the peers, the machine); it measures
nothing.
"""
from __future__ import annotations

from pathlib import Path

from ..engine.round import PHASES
from ..speculative.proposer import PLAIN, proposer_class
from .bench import exact_label


def _fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def pooled_label(cell: dict) -> str:
    """'ratio [low, high]' of the pooled slices (see pooled_ratio), '-' without one."""
    r, ci = cell.get("speedup_pooled"), cell.get("speedup_pooled_95")
    return "-" if r is None else f"{r:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def table(report: dict) -> str:
    """The terminal table: one row per cell, then the peers."""
    head = ["temp", "conc", "config", "tok/s", "tau", "pred", "N", "exact", "x ar", "paired", "pooled [95%]", "x hf",
            "x hf-pld", "bound", "share"]
    rows = []
    for c in report["cells"]:
        vp = c["speedup_vs_peers"]
        rows.append([f"{c['temperature']:g}", str(c["concurrency"]), c["label"], _fmt(c["tok_s"], ".1f"),
                     _fmt(c["mean_accept_length"]), _fmt(c.get("predicted_tau")), _fmt(c.get("mean_budget"), ".1f"),
                     exact_label(c.get("exact")), _fmt(c["speedup_vs_ar"]), _fmt(c.get("speedup_paired")),
                     pooled_label(c), _fmt(vp.get("hf_generate")), _fmt(vp.get("hf_prompt_lookup")), _fmt(c["bound"]),
                     _fmt(c["bound_share"])])
    for q in report["peers"]:
        rows.append([f"{q['temperature']:g}", "1", q["name"], _fmt(q["tok_s"], ".1f")] + ["-"] * 11)
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    line = lambda r: "  ".join(v.rjust(w) if i > 2 else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths)))
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def markdown(report: dict, pngs: list[Path]) -> str:
    """A short summary: the setup, the table, the plots."""
    m = report["meta"]
    lines = [f"# flashtree bench — {m['timestamp']}", "",
             f"Target `{m['model']}`, drafter `{m['draft']}` (block size {m['block_size']}), "
             f"{m['num_prompts']} prompts from `{m['prompts']}`, {m['max_tokens']} new tokens each "
             f"(ignore_eos={m['ignore_eos']}), device {m['device']} {m['dtype']}, {m['repeats']} repeats "
             f"after {m['warmup']} warm-up; tok/s are medians, speedups ratios measured in this run "
             "(`x ar`: of the medians; `paired`: the median of each repeat's ratio to `ar`'s pass of the "
             "same repeat; `pooled [95%]`: tokens over seconds of every repeat's slices summed, against `ar`'s "
             "same slices, with a 95 % bootstrap interval over the paired slices; "
             f"the configurations run interleaved in slices of {m.get('slice_prompts', '?')} prompts). "
             + peers_note(report),
             "", f"Command: `{m['command']}`. Machine: {m['platform']['cpu']}, {m['load']['before']['cpus']} CPUs, "
             f"{m['platform']['torch_threads']} torch threads; 1-minute load average "
             f"{_fmt(m['load']['before']['load_1m'])} before and {_fmt(m['load']['after']['load_1m'])} after.",
             "", "bound = tau × c(1) / (c_draft + c(N)) from isolated costs: one target forward of N tokens "
             "per sequence (c(1): plain decoding; N: root + draft nodes) and one drafter pass, each timed "
             "apart from the rounds (median of several calls at a context of "
             f"{_context(report)} tokens). share = speedup / bound = (1 + o_ar) / (1 + o_spec), o being a "
             "step's time beyond those model calls (tree building, packing, sampling, commit, prefill, Python) "
             "relative to them: below 1 when a speculative round's overhead weighs more than a plain step's.",
             "", "exact: at T=0 greedy identity — `yes k/n`: k of the n outputs (prompts × timed passes) equal "
             "plain decoding's (`ar`, ref) token for token; at T>0 the chi-square cell of `exactness.py` — the "
             "same method, budget, topk and top-k/top-p/min-p at that temperature, "
             f"{_exact_samples(report)} seeded runs on the tiny V=8 pair against its exactly enumerated "
             "distribution of the first tokens (`yes p=… k/n`: chi-square p > 1e-3, TV within sampling noise, drafts "
             "verified; k/n: seeded outputs equal to plain decoding's, each prompt keeping its seed in every config — "
             "exact up to float32 rounding of a draw at a CDF boundary). `ddtree@N/topkK`: budget N, at most K children per node (K=1: a chain). "
             "`@auto`: the tree size chosen every round (`N`: the mean draft nodes it verified per round, 0 "
             "for a plain round; `pred`: the mean tau it expected, to check its calibration; no bound: "
             "its tree changes every round).",
             "", "```", table(report), "```", "",
             "Where a step's time goes (ms per engine step, median over timed passes; `c(1)`, `draft`, "
             "`verify`: the isolated model costs of the bound), one row per cell — with `--compile-modes "
             "eager,compiled` the two modes side by side:", "", "```", phase_table(report), "```", ""]
    lines += [f"![{p.stem}]({p.name})" for p in pngs]
    return "\n".join(lines) + "\n"


def peers_note(report: dict) -> str:
    """The report's sentence on its peers: what each engine ran, and any peer skipped."""
    engines = {q["engine"] for q in report["peers"]}
    lookup = {q["engine"]: q for q in report["peers"] if q["prompt_lookup_num_tokens"]}
    parts = []
    if "transformers" in engines:
        parts.append("Peers: transformers `generate` and prompt-lookup assisted generation, batch 1, same weights; "
                     "the prompt-lookup peer copies as many tokens and matches n-grams as long as our `ngram` "
                     "(prompt_lookup_num_tokens = draft_len, max_matching_ngram_size = max_ngram, both trying n "
                     "down to 1).")
    if "llama.cpp" in engines:
        q = lookup.get("llama.cpp", {})
        version = report["meta"].get("versions", {}).get("llama-cpp-python") or "?"
        parts.append(f"llama.cpp (llama-cpp-python {version}), batch 1, on the GGUF file the model was converted "
                     "from (named by its weight type, e.g. `q4_1`; llama.cpp's quantized products quantize the "
                     "activations too, so its text there differs from ours) and on the same weights rewritten "
                     "unquantized (`f32`, `bf16`), each plain and with its prompt lookup (`lookup`: num_pred_tokens "
                     f"{q.get('prompt_lookup_num_tokens')}, max_ngram_size {q.get('max_matching_ngram_size')}), "
                     "n_threads = torch's, every prompt prefilled.")
    parts += report["meta"].get("peers_skipped", [])
    return " ".join(parts) or "No peers."




def phase_table(report: dict) -> str:
    """Per cell: the engine's phase times per step and the isolated model costs."""
    head = ["temp", "conc", "config", *PHASES, "c(1)", "draft", "verify"]
    rows = [[f"{c['temperature']:g}", str(c["concurrency"]), c["label"],
             *(_fmt(c["phase_ms_per_step"].get(k), ".3f") for k in PHASES),
             _fmt(c["costs_ms"]["c1"], ".3f"), _fmt(c["costs_ms"]["draft"] or None, ".3f"),
             _fmt(c["costs_ms"]["verify"], ".3f")] for c in report["cells"]]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = "  ".join(f"{{:{'<' if i == 2 else '>'}{w}}}" for i, w in enumerate(widths))
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows])


def _exact_samples(report: dict) -> str:
    ns = sorted({c["exact"]["samples"] for c in report["cells"] if c.get("exact", {}).get("samples")})
    return ", ".join(map(str, ns)) or "-"


def _context(report: dict) -> str:
    ctx = sorted({c["costs_ms"]["context"] for c in report["cells"]})
    return ", ".join(map(str, ctx)) or "-"


def write_plots(report: dict, out: Path) -> list[Path]:
    """speedup_vs_budget.png, tau_histogram.png, toks_vs_concurrency.png (matplotlib, Agg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = report["cells"]
    temps = sorted({c["temperature"] for c in cells})
    conc0 = min(c["concurrency"] for c in cells)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    paths = []
    methods = list(dict.fromkeys(c["method"] for c in cells))
    trees = [m for m in methods if proposer_class(m).sized_by_budget]               # curves over budgets
    # the other methods that draft (a plain round verifies its root alone): one config, a level line
    chains = [m for m in methods if m not in trees and proposer_class(m).round_tokens(None, None, 2, 1) > 1]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, t in enumerate(temps):
        col = colors[i % len(colors)]
        # every method drafting trees of a budget: a line style each (the first solid), its topk caps
        # in other markers; the bound beside the first one's uncapped curve
        for i, m in enumerate(trees):
            line, marks = ("-", "-.", "--")[i % 3], (("o", "s", "^", "v"), ("P", "X", "d", "<"))[i % 2]
            for j, k in enumerate(sorted({c.get("topk") for c in cells if c["method"] == m},
                                         key=lambda k: (k is not None, k or 0))):
                tree = sorted((c for c in cells if c["method"] == m and c["temperature"] == t and c["budget"] != "auto"
                               and c["concurrency"] == conc0 and c.get("topk") == k), key=lambda c: c["budget"])
                if not tree:
                    continue
                xs, name = [c["budget"] for c in tree], m if k is None else f"{m} topk={k}"
                ax.plot(xs, [c["speedup_vs_ar"] for c in tree], marks[j % 4] + line, color=col,
                        label=f"{name} T={t:g}")
                if k is None and i == 0:
                    ax.plot(xs, [c["bound"] for c in tree], ":", color=col, label=f"bound T={t:g}")
                ax.set_xscale("log", base=2)
                ax.set_xticks(xs, [str(x) for x in xs])
                ax.minorticks_off()
        for c in cells:
            if c["method"] in chains and c["temperature"] == t and c["concurrency"] == conc0:  # one config each
                ax.axhline(c["speedup_vs_ar"], ls=(":", "--")[chains.index(c["method"]) % 2], color=col, alpha=0.7,
                           label=f"{c['method']} T={t:g}")
            if c["budget"] == "auto" and c["temperature"] == t and c["concurrency"] == conc0 and c.get("topk") is None:
                # at the mean tree size it chose (a plain round counts 0 nodes; the log axis needs > 0)
                ax.plot([max(c["mean_budget"] or 0.0, 0.25)], [c["speedup_vs_ar"]],
                        "*" if trees.index(c["method"]) == 0 else "P", ms=12, color=col, label=f"{c['method']} auto T={t:g} (mean N {c['mean_budget']:.1f})")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xlabel="tree budget N (draft nodes per round; auto: the mean it chose)", ylabel="speedup vs ar (tok/s ratio)",
           title=f"Speedup vs budget (concurrency {conc0})")
    if ax.get_legend_handles_labels()[0]:  # (no tree method, e.g. ngram alone: nothing to label)
        ax.legend(fontsize=8)
    paths.append(_save(fig, out / "speedup_vs_budget.png"))

    spec = [c for c in cells if c["concurrency"] == conc0 and c["method"] != PLAIN] or \
           [c for c in cells if c["concurrency"] == conc0]
    fig, axes = plt.subplots(1, len(temps), figsize=(5 * len(temps), 4), squeeze=False)
    for ax, t in zip(axes[0], temps):
        group = [c for c in spec if c["temperature"] == t]
        width = 0.8 / max(len(group), 1)
        for j, c in enumerate(group):
            h = c["accept_length_histogram"]
            total = max(sum(h), 1)
            ax.bar([k + 1 + (j - (len(group) - 1) / 2) * width for k in range(len(h))],
                   [v / total for v in h], width, label=f"{c['label']} (mean {c['mean_accept_length']:.2f})")
        ax.set(xlabel="tau (tokens committed per round, bonus included)", ylabel="fraction of rounds",
               title=f"Accept length, T={t:g}")
        ax.legend(fontsize=8)
    paths.append(_save(fig, out / "tau_histogram.png"))

    fig, axes = plt.subplots(1, len(temps), figsize=(5 * len(temps), 4), squeeze=False)
    for ax, t in zip(axes[0], temps):
        labels = list(dict.fromkeys(c["label"] for c in cells))
        for lab in labels:
            pts = sorted((c["concurrency"], c["tok_s"]) for c in cells if c["label"] == lab and c["temperature"] == t)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=lab)
        for q in report["peers"]:
            if q["temperature"] == t:
                ax.axhline(q["tok_s"], ls="--", lw=1, color="grey")
                ax.annotate(f"{q['name']} (batch 1)", (min(c["concurrency"] for c in cells), q["tok_s"]),
                            fontsize=7, color="grey", va="bottom")
        ax.set(xlabel="concurrency (sequences per step)", ylabel="tok/s", title=f"Throughput, T={t:g}")
        ax.legend(fontsize=8)
    paths.append(_save(fig, out / "toks_vs_concurrency.png"))
    return paths


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
