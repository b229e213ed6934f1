"""deploy/flashtree.service: a valid systemd unit whose ExecStart is a valid `flashtree serve`."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flashtree.cli import build_parser
from flashtree.server.limits import ServerLimits

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "deploy" / "flashtree.service"


def sections(text: str) -> dict[str, dict[str, str]]:
    """systemd's syntax: [Section], Key=value, # comments, backslash continuation lines."""
    text = re.sub(r"\\\n", " ", text)
    out, cur = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            cur = out.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        cur[key.strip()] = value.strip()
    return out


def test_the_unit_serves_restarts_on_failure_and_reads_the_key_from_a_file():
    unit = sections(UNIT.read_text())
    svc = unit["Service"]
    argv = shlex.split(svc["ExecStart"])
    assert argv[0].startswith("/") and argv[0].endswith("/flashtree") and argv[1] == "serve"
    args = build_parser()[0].parse_args(argv[1:])  # every option is one `flashtree serve` knows
    assert args.command == "serve" and args.log_interval > 0 and args.api_key is None
    assert svc["Restart"] == "on-failure" and svc["KillSignal"] == "SIGTERM"
    assert svc["EnvironmentFile"].startswith("/etc/") and "FLASHTREE_API_KEY" in UNIT.read_text()
    assert "--api-key" not in svc["ExecStart"]  # arguments are visible in ps; the key comes from the file
    # systemd must let the SIGTERM drain finish before it kills the process
    assert int(svc["TimeoutStopSec"]) > args.shutdown_timeout == ServerLimits().shutdown_timeout_s
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_passes(tmp_path):
    """`systemd-analyze verify`, with ExecStart pointed at this installation's flashtree (verify checks
    that the command exists); any warning (an unknown key, a key in the wrong section) fails."""
    exe = Path(sys.executable).parent / "flashtree"
    assert exe.exists()
    text = re.sub(r"^ExecStart=\S+", f"ExecStart={exe}", UNIT.read_text(), flags=re.M)
    unit = tmp_path / "flashtree.service"
    unit.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), r.stdout + r.stderr
    bad = tmp_path / "bad" / "flashtree.service"  # the check can fail
    bad.parent.mkdir()
    bad.write_text(text.replace("[Service]\n", "[Service]\nRestartt=always\n"))
    r = subprocess.run(["systemd-analyze", "verify", str(bad)], capture_output=True, text=True, timeout=60)
    assert "Restartt" in r.stderr


def test_docs_say_how_to_run_check_and_roll_a_drafter():
    section = (ROOT / "docs" / "deployment.md").read_text()
    for needle in ("deploy/flashtree.service", "systemctl is-active flashtree",
                   "journalctl -u flashtree", "grep 'accept len'", "FLASHTREE_API_KEY",
                   "sudo ln -sfn /srv/flashtree/drafters/v2 /srv/flashtree/drafter", "systemctl restart flashtree"):
        assert needle in section, needle
