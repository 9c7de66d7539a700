"""The raw measurements behind calibration: messages and all-reduces between worker processes set up
as the runtime's, optimizer steps, a memory copy. Every process is reaped; one that fails or outlives
``timeout`` ends the measurement with an error naming its rank."""

from __future__ import annotations

import os
import statistics
import time
import traceback
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipelab.runtime.job import free_port
from pipelab.runtime.lifeline import MAIN_GUARD_HINT

#: optimizers calibration times, by the cost model's names
OPTIMIZERS: dict[str, Any] = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-3),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
}


#: seconds a probe idles before each point-to-point trip (a pipeline's messages come between actions)
IDLE_S = 2e-3
#: seconds a probe computes before each all-reduce (the runtime's U follows a backward at once)
BUSY_S = 2e-3
#: timed all-reduces per size and round, at least (the time is bimodal: a few samples miss the mix)
AR_TRIPS = 8


def _compute(seconds: float) -> None:
    """Keep this core busy with small matrix products for ``seconds`` (as a backward would)."""
    a = torch.full((64, 64), 0.01)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a = torch.tanh(a @ a)


def _trips(nbytes: int) -> int:
    """Timed repetitions per size: many for small (latency-bound, noisy) messages, few for large."""
    return max(3, min(15, (8 << 20) // max(nbytes, 1)))


def _wait(work: Any) -> None:
    if work is not None:     # None only for ranks outside the group
        work.wait()


def _rings(rank: int, world: int, sizes: Sequence[int]) -> Any:
    """Ranks 0 and 1's shared-memory rings, where the runtime would message through them by default
    (:func:`pipelab.runtime.process.open_comm`); ``None`` where it would use gloo's own path."""
    from pipelab.runtime import shm
    from pipelab.runtime.comm import TensorSpec

    peer = {0: 1, 1: 0}.get(rank)
    incoming = {} if peer is None else {peer: [[TensorSpec((max(max(sizes) // 4, 1),), "float32")]]}
    if shm.unusable(world, shm.ring_bytes(incoming), dist.get_backend()) is not None:
        return None
    return shm.ShmComm.open(rank, world, torch.device("cpu"), {}, incoming, [] if peer is None else [peer],
                            timeout=60.0)


def _p2p_sweep(rank: int, sizes: Sequence[int], repeats: int) -> tuple[str, list[tuple[int, int, float]]]:
    """The transport and its ``(round, bytes, one-way seconds)``: half a ping-pong between ranks 0 and 1
    on the runtime's path (shared-memory rings, or gloo's two lanes), after an idle moment as a
    pipeline's messages come between actions (rank 0's figures)."""
    from pipelab.runtime.comm import Recv, Send, TensorSpec

    rings = _rings(rank, dist.get_world_size(), sizes)     # every rank gets the same answer
    if rings is None:
        up: Any = dist.new_group(list(range(dist.get_world_size())))
        down: Any = dist.new_group(list(range(dist.get_world_size())))

    def send(buf: torch.Tensor, peer: int) -> None:
        if rings is not None:
            rings.send(Send(peer, 0, [buf]))
        else:
            _wait(dist.isend(buf, peer, group=up if peer == 1 else down))

    def recv(buf: torch.Tensor, peer: int) -> None:
        if rings is not None:
            buf.copy_(rings.wait(Recv(peer, 0, [TensorSpec(tuple(buf.shape), "float32")]))[0])
        else:
            _wait(dist.irecv(buf, peer, group=down if peer == 1 else up))

    p2p: list[tuple[int, int, float]] = []
    for r in range(repeats):
        for n in sizes:
            buf = torch.zeros(max(n // 4, 1), dtype=torch.float32)
            dist.barrier()
            trips = []
            for _ in range(_trips(n) + 1):     # the first trip warms the connection for this size
                if rank == 0:
                    time.sleep(IDLE_S)
                    t0 = time.perf_counter()
                    send(buf, 1)
                    recv(buf, 1)
                    trips.append((time.perf_counter() - t0) / 2)
                elif rank == 1:
                    recv(buf, 0)
                    send(buf, 0)
            if rank == 0:
                p2p.append((r, n, statistics.median(trips[1:])))
    if rings is not None:
        dist.barrier()
        rings.close()
    return ("shared memory" if rings is not None else dist.get_backend()), p2p


def _allreduce_sweep(rank: int, sizes: Sequence[int], repeats: int) -> list[tuple[int, int, int, float]]:
    """``(round, bytes, group size, mean seconds)`` of all-reduces over groups 2..world, each right after
    compute as a run's ``U`` (the mean: one takes ~0.3 ms or a scheduler slice, and a run pays the mix)."""
    world = dist.get_world_size()
    groups: dict[int, Any] = {p: dist.new_group(list(range(p))) for p in range(2, world + 1)}
    ar: list[tuple[int, int, int, float]] = []
    for r in range(repeats):
        for p, g in groups.items():
            for n in sizes:
                buf = torch.ones(max(n // 4, 1), dtype=torch.float32)
                dist.barrier()
                if rank < p:
                    dist.all_reduce(buf, group=g)
                    ts = []
                    for _ in range(max(_trips(n), AR_TRIPS)):
                        _compute(BUSY_S)
                        t0 = time.perf_counter()
                        dist.all_reduce(buf, group=g)
                        ts.append(time.perf_counter() - t0)
                    ar.append((r, n, p, statistics.fmean(ts)))
    return ar


def _group_main(rank: int, world: int, port: int, backend: str, sizes: Sequence[int], repeats: int,
                queue: Any) -> None:
    """One probe process: ping-pong between ranks 0 and 1, then all-reduces over groups 2..world."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    from pipelab.runtime.affinity import pin_worker

    pin_worker(rank, world)     # as the runtime pins its CPU workers (a core each where they fit)
    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
        transport, p2p = _p2p_sweep(rank, sizes, repeats)
        ar = _allreduce_sweep(rank, sizes, repeats)
        dist.barrier()
        queue.put(("ok", rank, {"p2p": p2p, "allreduce": ar, "transport": transport}))
    except BaseException:
        queue.put(("error", rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def p2p_and_allreduce(workers: int, backend: str, sizes: Sequence[int], repeats: int,
                      timeout: float = 120.0) -> dict[str, Any]:
    """Rank 0's timings (``{"p2p": [(round, n, s)], "allreduce": [(round, n, p, s)], "transport": name}``)
    of a group of ``workers`` processes; raises ``RuntimeError`` naming the rank that failed or hung."""
    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_group_main, args=(r, workers, port, backend, list(sizes), repeats, queue),
                         daemon=True) for r in range(workers)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < workers:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(workers)) - set(results))
                raise RuntimeError(f"calibration probe: worker(s) {missing} did not finish within "
                                   f"{timeout:.0f} s")
            try:
                status, rank, payload = queue.get(timeout=min(left, 1.0))
            except Exception:   # queue.Empty: check that nobody died silently
                dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)
                        and r not in results]
                if dead:
                    raise RuntimeError(f"calibration probe: worker {dead[0][0]} exited with code "
                                       f"{dead[0][1]} without a word. {MAIN_GUARD_HINT}") from None
                continue
            if status == "error":
                raise RuntimeError(f"calibration probe: worker {rank} failed:\n{payload}")
            results[rank] = payload
    finally:
        _reap(*procs)
    return dict(results[0])


def _reap(*procs: Any) -> None:
    """Join each process, killing one still alive after 5 s."""
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()


#: parameter tensors per set in the optimizer sweep: few large ones, and many (a model's biases, norms)
TENSOR_COUNTS = (4, 32)


def last_level_cache_bytes(default: int = 32 << 20,
                           sysfs: str | os.PathLike[str] = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """This host's last-level CPU cache bytes (Linux sysfs), or ``default`` where it cannot be read."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        base = Path(sysfs)
        _, index = max((int((d / "level").read_text()), d) for d in base.iterdir()
                       if d.name.startswith("index"))
        text = (index / "size").read_text().strip().upper()
        return int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)
    except (OSError, ValueError, IndexError):
        return default


#: bytes written between two timed optimizer steps, as a run's forward and backward evict the state
EVICT_BYTES = last_level_cache_bytes()


def optimizer_steps(param_bytes: Sequence[int], repeats: int,
                    tensor_counts: Sequence[int] = TENSOR_COUNTS) -> dict[str, list[tuple[int, int, float]]]:
    """Per optimizer, ``(parameter bytes, tensors, median seconds)`` of the runtime's ``U`` (``step()``
    then ``zero_grad(set_to_none=True)``) over ``param_bytes`` x ``tensor_counts``, caches evicted."""
    evict = torch.empty(EVICT_BYTES // 4)
    out: dict[str, list[tuple[int, int, float]]] = {}
    for name, make in OPTIMIZERS.items():
        rows = []
        for nbytes in param_bytes:
            for count in tensor_counts:
                n = max(nbytes // (4 * count), 1)
                ps = [torch.nn.Parameter(torch.randn(n)) for _ in range(count)]
                opt = make(ps)
                ts = []
                for r in range(2 + repeats):
                    for p in ps:
                        p.grad = torch.randn_like(p)
                    evict.fill_(float(r))
                    t0 = time.perf_counter()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    ts.append(time.perf_counter() - t0)
                rows.append((int(sum(p.numel() * 4 for p in ps)), count, statistics.median(ts[2:])))
        out[name] = rows
    return out


def memory_copy(nbytes: int, repeats: int) -> list[float]:
    """Bytes per second of ``dst.copy_(src)`` of ``nbytes`` (read plus write), one per repeat."""
    src = torch.ones(max(nbytes // 4, 1))
    dst = torch.empty_like(src)
    dst.copy_(src)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        out.append(2 * src.numel() * 4 / (time.perf_counter() - t0))
    return out
