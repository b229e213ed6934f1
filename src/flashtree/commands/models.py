"""`flashtree models`: the models flashtree knows by name, where each comes from, and its drafter."""
from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object per model")


def run(args) -> int:
    import json

    from ..models.registry import MODELS, default_name
    default = default_name()
    for m in MODELS.values():
        drafter = str(m.drafter) if m.has_drafter() else None
        if args.json:
            print(json.dumps({"name": m.name, "default": m.name == default, "summary": m.summary,
                              "source": m.source, "drafter": drafter}))
            continue
        print(f"{m.name}{'  (default)' if m.name == default else ''}\n  {m.summary}\n  from: {m.source}\n"
              f"  drafter: {drafter or 'none yet (methods ar and ngram)'}")
    return 0
