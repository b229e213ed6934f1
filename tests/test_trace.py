"""`flashtree trace`: the page holds every round, and headless Chromium renders it."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from flashtree.cli import main

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def trace(tiny_pair, tmp_path_factory):
    target, draft = tiny_pair
    page = tmp_path_factory.mktemp("trace") / "out" / "trace.html"
    assert main(["trace", "t1 t2 t3 t4 t5", "--model", str(target), "--draft", str(draft), "--method", "ddtree",
                 "--budget", "5", "--max-tokens", "10", "--out", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="trace-data">(.*?)</script>', text, re.S)
                      .group(1).replace("<\\/", "</"))
    return page, text, data


def test_trace_page_holds_every_round(trace):
    _, text, data = trace
    rounds = data["rounds"]
    assert rounds and data["meta"]["method"] == "ddtree" and data["meta"]["budget"] == 5
    assert text.count('<section class="round"') == len(rounds)
    # every token after the prefill's was committed by a logged round
    assert sum(r["tau"] for r in rounds) + 1 == data["meta"]["completion_tokens"] == 10
    for n, r in enumerate(rounds, 1):
        assert r["tau"] == len(r["path"]) and r["path"][0] == 0
        assert len(r["tokens"]) == len(r["parents"]) == len(r["depths"]) == len(r["logprobs"]) <= 6
        assert all(r["parents"][b] == a for a, b in zip(r["path"], r["path"][1:]))  # a root path
        assert f'id="round-{n}" data-tau="{r["tau"]}"' in text
        assert "verify_forward" in r["times"] and "draft" in r["times"]
    assert text.count('class="node bonus"') == len(rounds)
    assert text.count('class="node accepted"') == sum(r["tau"] for r in rounds)
    assert "%</text>" in text  # draft probabilities are printed on the nodes


def test_trace_page_is_self_contained(trace):
    _, text, _ = trace
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\(", text)
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text)


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        msg = "headless Chromium is not installed (Debian: apt-get install -y chromium)"
        if os.environ.get("FLASHTREE_REQUIRE_CHROMIUM") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def _run_chromium(exe, tmp_path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120)


def test_trace_renders_in_headless_chromium(trace, tmp_path):
    exe = _chromium()
    page, _, data = trace
    dom = _run_chromium(exe, tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    for n, r in enumerate(data["rounds"], 1):
        assert re.search(rf"Round {n} <span class=\"tau\">τ = {r['tau']}</span>", dom.stdout)
    assert dom.stdout.count("<svg") >= len(data["rounds"]) + 1

    import matplotlib.image as mpimg
    shot = tmp_path / "shot.png"
    res = _run_chromium(exe, tmp_path, f"--screenshot={shot}", "--window-size=1200,900", page.as_uri())
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    img = mpimg.imread(shot)[..., :3]
    assert img.shape[:2] == (900, 1200)
    background = (abs(img - img[5, 5]).sum(-1) < 0.02).mean()
    assert background < 0.97 and img.std() > 0.02  # text, boxes and the tree were drawn
    greenish = ((img[..., 1] > img[..., 0] + 0.05) & (img[..., 1] > img[..., 2] + 0.02)).mean()
    assert greenish > 0  # the accepted-path highlight is visible


def test_missing_chromium_fails_when_required(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("FLASHTREE_REQUIRE_CHROMIUM", "1")
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y chromium"):
        _chromium()
    monkeypatch.setenv("FLASHTREE_REQUIRE_CHROMIUM", "0")
    with pytest.raises(pytest.skip.Exception):
        _chromium()
