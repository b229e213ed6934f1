"""The soak/fuzz run of scripts/soak.py in its short (CI) mode: a real `flashtree serve` process
under concurrent streams, disconnects and 300+ fuzzed requests must give no 5xx, only OpenAI error
bodies, free every slot, keep greedy output and stay healthy."""
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "soak.py"


def test_soak_short(tmp_path):
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--short", "--out", str(out), "--log", str(tmp_path / "server.log")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + (tmp_path / "server.log").read_text()[-3000:]
    report = json.loads(out.read_text())
    assert all(report["checks"].values()) and report["by_kind"]["fuzz"] >= 300
    assert report["by_status"].get("200", 0) > 50 and report["by_status"].get("400", 0) > 50  # both kinds ran
    assert not any(k.isdigit() and int(k) >= 500 for k in report["by_status"])
