"""Test helpers for the HTTP server: a real uvicorn server in a thread, metrics, polling."""
from __future__ import annotations

import re
import socket
import threading
import time

import httpx
import uvicorn


class Running:
    """`app` served by uvicorn on a free loopback port in a background thread."""

    def __init__(self, app, sock: socket.socket | None = None, **config):
        if sock is None:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", **config))
        self.port = sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


def served(llm, model_name: str = "tiny") -> Running:
    """`llm` behind flashtree's OpenAI app on a free loopback port (`.llm` is it; stop() when done)."""
    from flashtree.server.app import create_app
    r = Running(create_app(llm, model_name=model_name))
    r.llm = llm
    return r


def openai_client(r: Running, timeout: float = 120):
    """The official client pointed at `r`, no retries."""
    import openai
    return openai.OpenAI(base_url=r.base + "/v1", api_key="unused", max_retries=0, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(base: str, name: str, labels: dict | None = None, headers: dict | None = None) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in httpx.get(base + "/metrics", headers=headers).text.splitlines():
        m = re.match(r"^(\w+)(\{[^}]*\})? ([-+\deE.naninf]+)$", line)
        if m and m.group(1) == name:
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(have.get(k) == v for k, v in (labels or {}).items()):
                total += float(m.group(3))
    return total


def wait_for(cond, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def server_up(proc, base: str, timeout: float = 120.0) -> bool:
    """Wait until the server process `proc` answers /health at `base` (fails if it exits)."""
    def up():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else f"exited {proc.returncode}"
        try:
            return httpx.get(base + "/health").status_code == 200
        except httpx.TransportError:
            return False
    return wait_for(up, timeout=timeout)
