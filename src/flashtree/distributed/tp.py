"""Running the target over several ranks: process launch, and rank 0 telling the others what to run.

Rank 0 owns everything a request touches — the scheduler, the block manager, trees, sampling,
the server. Before each target forward (and each KV move) its model runner broadcasts the
forward's inputs on the channel `Ranks.join` hands it (`wire.py`: the op codes and their
packing); every other rank runs `serve_worker`: it receives them, runs the same forward on its
shard of the target (the layers all-reduce inside it) and writes its share of the KV cache at the
same physical rows. A rank > 0 has no block manager: it allocates the page layout rank 0 sends
first and writes wherever rank 0's rows say. Other ranks never open a port and never see a
token's text.

Launch: `LLM(tensor_parallel_size=N)` spawns ranks 1..N-1 on this machine (`spawn_workers`);
under `torchrun` (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set) every rank runs the same
command and ranks > 0 become workers (`cli.py`). Backend: NCCL on CUDA, gloo on CPU. A rank that
dies or stops answering makes rank 0's next collective fail within `timeout_s`: the engine
stops, the server reports unhealthy and exits.

Ownership: `Ranks` is rank 0's handle on one group (its spawned processes, its membership, its
channel), owned by one `LLM`. torch.distributed gives a process one default group, so one `Ranks`
is open per process: a second is refused, naming how to close the first, until `close` stops the
other ranks and leaves the group.
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import UserError
from .wire import INIT, MOVE, PING, STOP, TARGET, Channel

log = logging.getLogger("flashtree.distributed")


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init(rank: int, world: int, device: torch.device, init_method: str | None = None, timeout_s: float = 60.0):
    """Join the process group (env:// under torchrun, else init_method). On CPU each rank takes its
    share of the cores (ranks spinning on the same cores slow every all-reduce down)."""
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(backend_for(device), init_method=init_method or "env://", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))


def leave() -> None:
    """Leave the process group (a later LLM may form a new one)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_worker(rank: int, world: int, model: str, dtype: str, device: str, init_method: str | None = None,
                 timeout_s: float = 60.0) -> None:
    """A rank > 0: load this rank's shard, then run every forward rank 0 sends until it says stop
    (or goes away)."""
    from ..engine.model_runner import ModelRunner
    from ..models.loader import load_target, resolve_device
    from ..models.parallel import TPGroup
    dev = resolve_device(device)
    target = load_target(model, dtype=dtype, device=dev, tp=TPGroup(rank, world)).fuse()
    init(rank, world, dev, init_method, timeout_s)
    channel = Channel(dev)
    op, ints, _ = channel.recv()
    if op != INIT:
        raise RuntimeError(f"rank {rank}: expected the cache layout first, got op {op}")
    num_pages, page_size = ints[0], ints[1]
    # the page layout only: rank 0 decides every page, and each op carries the physical rows it touches
    runner = ModelRunner(target, None, None, None, compile=False, layout=(num_pages, page_size))
    log.info("rank %d/%d ready: %d KV pages of %d", rank, world, num_pages, page_size)
    try:
        with torch.inference_mode():
            while True:
                op, _, t = channel.recv()
                if op == TARGET:
                    runner.execute_target(*t)
                elif op == MOVE:
                    runner.move_rows(t[0], t[1])
                elif op == STOP:
                    return
                elif op == PING:
                    continue
                else:
                    raise RuntimeError(f"rank {rank}: unknown op {op}")
    finally:
        dist.destroy_process_group()


def spawn_workers(world: int, model: str, dtype: str, device: str, timeout_s: float = 60.0):
    """Ranks 1..world-1 as processes on this machine (`python -m flashtree.distributed.tp`, so the
    caller's script is never re-imported); returns (their processes, the init method)."""
    init_method = f"tcp://127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([sys.executable, "-m", "flashtree.distributed.tp", str(r), str(world), str(model), dtype,
                               device, init_method, str(timeout_s)]) for r in range(1, world)]
    return procs, init_method


_open: Ranks | None = None  # the group this process is rank 0 of, while it is open
_torchrun_served = False    # under torchrun the other ranks serve one group, then exit


class Ranks:
    """Rank 0's side of one tensor-parallel group: ranks 1..world-1 (spawned here, or torchrun's),
    this process's membership and the channel to them. Refused while another is open."""

    def __init__(self, world: int, model: str, dtype: str, device: str, timeout_s: float = 60.0):
        global _open, _torchrun_served
        _check_free(world)
        self.world, self.channel, self.closed = world, None, False
        self.procs, self.init_method = [], None
        if under_torchrun():
            _torchrun_served = True
        else:
            self.procs, self.init_method = spawn_workers(world, model, dtype, device, timeout_s)
        _open = self

    def join(self, device: torch.device) -> Channel:
        """Form the group with the other ranks; the channel rank 0 sends each forward on (what the
        model runner takes as its `Broadcaster`)."""
        init(0, self.world, device, self.init_method)
        self.channel = Channel(device)
        return self.channel

    def close(self) -> None:
        """Tell the other ranks to stop, leave the group and reap the spawned ranks (idempotent)."""
        global _open
        if self.closed:
            return
        self.closed = True
        if _open is self:
            _open = None
        if self.channel is not None:
            try:
                self.channel.stop()
            except Exception:
                pass
            leave()
        for p in self.procs:
            try:
                p.wait(timeout=10 if self.channel is not None else 0)  # never joined: they wait for no one
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _check_free(world: int) -> None:
    """Refuse a group this process cannot form, before any rank starts."""
    if _open is not None:
        raise UserError("another tensor-parallel LLM is still open in this process, and torch.distributed gives "
                        "a process one default process group: close it first with llm.close(), or create it as "
                        "`with LLM(...) as llm:` (an LLM nothing references any more is closed too)")
    if dist.is_initialized():
        raise UserError("this process already belongs to a torch.distributed process group that flashtree did not "
                        "create: call torch.distributed.destroy_process_group() before "
                        "LLM(tensor_parallel_size > 1)")
    if under_torchrun():
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if (rank, size) != (0, world):
            raise UserError(f"under torchrun this process is rank {rank} of {size}; the engine runs on rank 0 "
                            f"with tensor_parallel_size == WORLD_SIZE ({world} given)")
        if _torchrun_served:
            raise UserError("under torchrun the other ranks serve one tensor-parallel LLM and exit when it closes: "
                            "create one tensor-parallel LLM per torchrun launch")


if __name__ == "__main__":
    rank_, world_, model_, dtype_, device_, init_, timeout_ = sys.argv[1:8]
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank_} %(levelname)s %(name)s: %(message)s")
    try:
        serve_worker(int(rank_), int(world_), model_, dtype_, device_, init_, float(timeout_))
    except Exception as e:
        log.error("rank %s stopped: %s: %s", rank_, type(e).__name__, e)
        sys.exit(1)
