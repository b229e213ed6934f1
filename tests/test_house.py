"""The house rules that no linter checks: a module stays short enough to read at one sitting.
(The import layers, cycles and ruff's rules run in `make lint`, which `make test` runs first.)"""
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "flashtree"
MAX_LINES = 600


def long_modules(root: Path, limit: int) -> list[str]:
    """'path: lines' for every .py file under root longer than limit lines."""
    out = []
    for path in sorted(root.rglob("*.py")):
        n = len(path.read_text().splitlines())
        if n > limit:
            out.append(f"{path.relative_to(root.parent)}: {n}")
    return out


def test_no_module_is_over_600_lines():
    assert list(SRC.rglob("*.py")), f"no modules found under {SRC}"
    assert long_modules(SRC, MAX_LINES) == []


@pytest.mark.parametrize("limit", [100, 300])
def test_the_size_check_finds_long_modules(limit):
    """Negative control: at a lower limit the same check names modules (engine.py among them)."""
    found = long_modules(SRC, limit)
    assert any(line.startswith("flashtree/engine/engine.py:") for line in found)
