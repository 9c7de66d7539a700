"""HetPipe's Wave Synchronous Parallel (WSP) parameter server: the logic and a process serving it.

HetPipe (Park et al., USENIX ATC'20, §4-§5): a virtual worker (VW) pushes its update at a wave's
end; the global clock is the minimum local clock; a VW starts a wave at most ``D`` clocks ahead,
pulling the global weights. Invariant: a pull adds every complete clock's updates and the puller's
own, in (clock, VW) order, never arrival order, so with ``D = 0`` a run is bit-identical to the
reference. One :class:`WSPServer` shard per stage; :func:`serve` runs them behind pipes.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np
import torch

from pipelab.runtime.lifeline import watch_launcher


@dataclass(frozen=True)
class WSPEvent:
    """One server-side event: a push received or a pull granted (``clock`` = the VW's local clock)."""

    t: float
    kind: str          # "push" | "pull"
    stage: int
    vw: int
    clock: int         # local clock of the VW after the push / at the pull
    global_clock: int  # global clock right after the event


class WSPServer:
    """One shard's weights, the VWs' local clocks and the staleness rule ``D`` (thread-safe)."""

    def __init__(self, params: Mapping[str, torch.Tensor], num_virtual_workers: int, staleness: int,
                 *, stage: int = 0) -> None:
        if num_virtual_workers < 1:
            raise ValueError(f"num_virtual_workers={num_virtual_workers} must be >= 1")
        if staleness < 0:
            raise ValueError(f"staleness bound D={staleness} must be >= 0 (0 = wave-level BSP)")
        self.stage, self.num_virtual_workers, self.staleness = stage, num_virtual_workers, staleness
        self._committed = {k: v.detach().clone() for k, v in params.items()}
        self._pending: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self.clocks = [0] * num_virtual_workers
        self.log: list[WSPEvent] = []
        self._cond = threading.Condition()
        self._t0 = time.time()

    @property
    def global_clock(self) -> int:
        """Minimum of the VWs' local clocks."""
        return min(self.clocks)

    def may_start(self, vw: int) -> bool:
        """Whether VW ``vw`` may start its next wave: local clock - global clock <= D."""
        return self.clocks[vw] - self.global_clock <= self.staleness

    def _check_vw(self, vw: int) -> None:
        if not 0 <= vw < self.num_virtual_workers:
            raise ValueError(f"virtual worker {vw} is outside 0..{self.num_virtual_workers - 1}")

    def _commit(self) -> None:
        # Fold every complete clock (< global clock) into the committed weights, VW order.
        g = self.global_clock
        for key in sorted(k for k in self._pending if k[0] < g):
            for name, u in self._pending.pop(key).items():
                self._committed[name].add_(u)

    def weights(self, vw: int | None = None) -> dict[str, torch.Tensor]:
        """Global weights as VW ``vw`` sees them (``None``: every update received), in (clock, VW) order."""
        out = {k: v.clone() for k, v in self._committed.items()}
        for key in sorted(self._pending):
            if vw is None or key[1] == vw:
                for name, u in self._pending[key].items():
                    out[name].add_(u)
        return out

    def push(self, vw: int, update: Mapping[str, torch.Tensor]) -> int:
        """Add VW ``vw``'s aggregated wave update; advance its clock; return the new global clock."""
        self._check_vw(vw)
        missing, extra = set(self._committed) - set(update), set(update) - set(self._committed)
        if missing or extra:
            raise ValueError(f"WSP push from virtual worker {vw} (stage {self.stage}) has wrong keys: "
                             f"missing {sorted(missing)}, unexpected {sorted(extra)}")
        with self._cond:
            self._pending[(self.clocks[vw], vw)] = {k: v.detach().clone() for k, v in update.items()}
            self.clocks[vw] += 1
            self._commit()
            self._log("push", vw)
            self._cond.notify_all()
            return self.global_clock

    def try_pull(self, vw: int) -> tuple[dict[str, torch.Tensor], int] | None:
        """Global weights and global clock if VW ``vw`` may start its next wave, else ``None``."""
        self._check_vw(vw)
        with self._cond:
            if not self.may_start(vw):
                return None
            self._log("pull", vw)
            return self.weights(vw), self.global_clock

    def _log(self, kind: str, vw: int) -> None:
        self.log.append(WSPEvent(time.time() - self._t0, kind, self.stage, vw, self.clocks[vw],
                                 self.global_clock))

    def pull(self, vw: int, timeout: float | None = None) -> tuple[dict[str, torch.Tensor], int]:
        """Block until VW ``vw`` may start its next wave, then return (global weights, global clock)."""
        self._check_vw(vw)
        with self._cond:
            if not self._cond.wait_for(lambda: self.may_start(vw), timeout=timeout):
                raise TimeoutError(f"virtual worker {vw} waited {timeout} s for the global clock "
                                   f"({self.global_clock}, local clocks {self.clocks}, D={self.staleness}); "
                                   "a slower virtual worker stopped pushing")
            out = self.try_pull(vw)
            assert out is not None
            return out


def check_staleness(log: Sequence[WSPEvent], num_virtual_workers: int, staleness: int) -> int:
    """Replay a log, recomputing the global clock; return the largest lead at a pull (assert <= bound)."""
    shards: dict[int, list[int]] = {}
    worst = 0
    for e in log:
        clocks = shards.setdefault(e.stage, [0] * num_virtual_workers)
        if e.kind == "push":
            clocks[e.vw] += 1
            if clocks[e.vw] != e.clock:
                raise AssertionError(f"stage {e.stage} VW {e.vw}: push recorded clock {e.clock}, replay says "
                                     f"{clocks[e.vw]}")
        elif e.kind == "pull":
            worst = max(worst, gap := clocks[e.vw] - min(clocks))
            if gap > staleness:
                raise AssertionError(f"stage {e.stage} VW {e.vw} pulled at clock {clocks[e.vw]} while the "
                                     f"global clock was {min(clocks)}: {gap} > D={staleness}")
    return worst


def _to_wire(d: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    # numpy arrays pickle as plain bytes: no shared-memory file descriptors to leak across pipes.
    return {k: v.detach().cpu().numpy() for k, v in d.items()}


def _from_wire(d: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in d.items()}


def serve(conns: Sequence[Connection], shards: Mapping[int, Mapping[str, torch.Tensor]],
          num_virtual_workers: int, staleness: int) -> list[WSPEvent]:
    """Serve ``conns`` (one per worker) until every worker said ``"stop"``; return the merged log.

    Requests: ``("push", stage, vw, arrays)`` -> ``("ok", clock)``; ``("pull", stage, vw)`` ->
    ``("weights", arrays, clock)`` once the rule allows; ``("stop",)``.
    """
    servers = {s: WSPServer(p, num_virtual_workers, staleness, stage=s) for s, p in shards.items()}
    t0 = time.time()
    for srv in servers.values():
        srv._t0 = t0
    open_conns = list(conns)
    waiting: list[tuple[Connection, int, int]] = []

    def serve_waiting() -> None:
        for c, s, v in list(waiting):
            got = servers[s].try_pull(v)
            if got is not None:
                waiting.remove((c, s, v))
                c.send(("weights", _to_wire(got[0]), got[1]))

    while open_conns:
        for c in wait(open_conns):
            assert isinstance(c, Connection)
            try:
                msg = c.recv()
            except EOFError:
                open_conns.remove(c)
                continue
            kind = msg[0]
            if kind == "push":
                _, s, v, upd = msg
                try:
                    g = servers[s].push(v, _from_wire(upd))
                except (KeyError, ValueError) as exc:
                    c.send(("error", f"{type(exc).__name__}: {exc}"))
                    continue
                c.send(("ok", g))
                serve_waiting()
            elif kind == "pull":
                waiting.append((c, msg[1], msg[2]))
                serve_waiting()
            elif kind == "stop":
                open_conns.remove(c)
            else:
                c.send(("error", f"unknown WSP message {kind!r}"))
    return sorted((e for srv in servers.values() for e in srv.log), key=lambda e: e.t)


def serve_process_main(conns: Sequence[Connection], shards: Mapping[int, Mapping[str, np.ndarray]],
                       num_virtual_workers: int, staleness: int, result: Connection | None = None) -> None:
    """The server process: :func:`serve`, then the log on ``result``; dies with its launcher."""
    watch_launcher()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    log = serve(conns, {s: _from_wire(p) for s, p in shards.items()}, num_virtual_workers, staleness)
    if result is not None:
        result.send(log)
        result.close()


class WSPClient:
    """A worker's end of the parameter server (stage ``stage`` of virtual worker ``vw``)."""

    def __init__(self, conn: Connection, stage: int, vw: int, timeout: float = 300.0,
                 device: torch.device | str = "cpu") -> None:
        self.conn, self.stage, self.vw, self.timeout = conn, stage, vw, timeout
        self.device = torch.device(device)   # pulled weights land here (the server keeps CPU copies)
        self.clock = 0

    def _recv(self, what: str) -> Any:
        if not self.conn.poll(self.timeout):
            raise TimeoutError(f"stage {self.stage} of virtual worker {self.vw}: the WSP parameter server "
                               f"did not answer a {what} within {self.timeout} s (a slower virtual worker "
                               "may have failed)")
        msg = self.conn.recv()
        if msg[0] == "error":
            raise RuntimeError(f"WSP parameter server: {msg[1]}")
        return msg

    def push(self, update: Mapping[str, torch.Tensor]) -> int:
        """Send this wave's aggregated update; returns the global clock after it."""
        self.conn.send(("push", self.stage, self.vw, _to_wire(update)))
        _, g = self._recv("push")
        self.clock += 1
        return int(g)

    def pull(self) -> tuple[dict[str, torch.Tensor], int]:
        """Wait until the staleness bound allows the next wave; return (global weights, global clock)."""
        self.conn.send(("pull", self.stage, self.vw))
        _, w, g = self._recv("pull")
        return {k: v.to(self.device) for k, v in _from_wire(w).items()}, int(g)

    def stop(self) -> None:
        """Tell the server this worker is done."""
        with contextlib.suppress(BrokenPipeError, OSError):
            self.conn.send(("stop",))


def check_trace(trace: Any, staleness: int) -> int:
    """:func:`check_staleness` on a run's trace: the largest lead of a VW at a pull."""
    ranks = trace.meta.get("stage_ranks")
    if not ranks:
        raise ValueError("the trace has no meta['stage_ranks']; pass a trace from pl.train(method='hetpipe')")
    evs = sorted((WSPEvent(e.start_s, e.kind, e.stage, list(ranks[e.stage]).index(e.worker), e.microbatch,
                           e.weight_version) for e in trace.events if e.kind in ("push", "pull")),
                 key=lambda e: e.t)    # the push/pull events, VW = replica index
    if not evs:
        raise ValueError("the trace has no push/pull events; is it a hetpipe run with a full wave?")
    return check_staleness(evs, len(ranks[0]), staleness)
