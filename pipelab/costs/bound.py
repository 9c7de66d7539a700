"""The steady-state bound of an asynchronous pipeline: the largest of four lower bounds on seconds per
minibatch (compute, ports, round trip, 1F1B cycles), each tight in its regime (docs/cost_model.md)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

import pipelab.metrics as metrics
from pipelab.costs.prices import Prices, span


@dataclass(frozen=True)
class SteadyState:
    """Terms of :meth:`CostModel.steady_state` (seconds per minibatch unless said otherwise)."""

    time_s: float                              # the prediction: the largest term below
    compute_s: tuple[float, ...]               # per stage: one replica's minibatch / replicas
    ports_s: dict[Hashable, float]             # per port: busy seconds per minibatch
    round_trip_s: tuple[float, ...]            # per stage: round trip / minibatches in flight
    transfer_wait_s: tuple[float, ...]         # per cut: mean seconds of one transfer incl. burst wait
    # per window (s, e), e > s, of adjacent unreplicated stages: its 1F1B cycle / minibatches it
    # completes (the slowest window starting at each s)
    cycles_s: dict[tuple[int, int], float] = field(default_factory=dict)

    @property
    def bottleneck(self) -> str:
        """Which term sets the time: ``"compute s"``, ``"port (out, k, block)"``, ``"round trip s"`` or
        ``"1F1B cycle s-e"``."""
        named = [*((f"compute {s}", t) for s, t in enumerate(self.compute_s)),
                 *((f"port {p}", t) for p, t in self.ports_s.items()),
                 *((f"round trip {s}", t) for s, t in enumerate(self.round_trip_s)),
                 *((f"1F1B cycle {s}-{e}", t) for (s, e), t in self.cycles_s.items())]
        return next((name for name, t in named if t == self.time_s), "none")


@dataclass(frozen=True)
class SteadyStateBound(Prices):
    """The steady-state bound over :class:`Prices` (mixed into :class:`~pipelab.costs.CostModel`)."""

    def steady_state(self, ranges: Sequence[tuple[int, int]], workers: Sequence[Sequence[int]], *,
                     in_flight: Sequence[int] | None = None) -> SteadyState:
        """Seconds per minibatch of an asynchronous pipeline: stage ``s`` runs ``ranges[s]`` round-robin
        on ``workers[s]``, ``in_flight[s]`` minibatches per replica (default: :func:`metrics.in_flight`)."""
        P = len(ranges)
        if P == 0 or len(workers) != P:
            raise ValueError(f"steady_state needs one worker list per stage; got {P} ranges and "
                             f"{len(workers)} worker lists")
        compute, rep_time = self._stage_compute(ranges, workers)
        loads: dict[Hashable, float] = {}
        waits = [self._cut_load(ranges[s][1] - 1, list(workers[s]), list(workers[s + 1]), loads)
                 for s in range(P - 1)]
        flights = list(in_flight) if in_flight is not None else [
            metrics.in_flight([len(w) for w in workers], s) for s in range(P)]
        rt = [(sum(rep_time[s:]) + 2 * sum(waits[s:])) / (flights[s] * len(workers[s])) for s in range(P)]
        cycles = self._one_f_one_b_cycles(rep_time, waits, flights, [len(w) for w in workers])
        time = max([*compute, *loads.values(), *rt, *cycles.values()])
        return SteadyState(time_s=time, compute_s=tuple(compute), ports_s=dict(loads),
                           round_trip_s=tuple(rt), transfer_wait_s=tuple(waits), cycles_s=cycles)

    def _stage_compute(self, ranges: Sequence[tuple[int, int]], workers: Sequence[Sequence[int]]
                       ) -> tuple[list[float], list[float]]:
        """Per stage: (one replica's minibatch / replicas, the layers' F + B at the slowest replica)."""
        compute, rep_time = [], []
        for (a, b), ws in zip(ranges, workers):
            if not ws:
                raise ValueError(f"stage [{a}, {b}) has no workers")
            speed = min(self.cluster.speed(w) for w in ws)
            compute.append(self.replica_time_s(a, b, ws) / len(ws))
            rep_time.append((span(self.forward_prefix, a, b) + span(self.backward_prefix, a, b)) / speed)
        return compute, rep_time

    def _cut_load(self, boundary: int, src_ws: list[int], dst_ws: list[int],
                  loads: dict[Hashable, float]) -> float:
        """Add the cut's busy seconds per minibatch to each port in ``loads``; its mean transfer wait
        (a FIFO port serves a burst of ``k`` lock-step senders in ``(k + 1) / 2`` transfers on average)."""
        nbytes = self.cut_bytes(boundary)
        L = math.lcm(len(src_ws), len(dst_ws))
        wait = 0.0
        burst: dict[tuple[int, Hashable], set[int]] = {}
        for m in range(L):
            a, b = src_ws[m % len(src_ws)], dst_ws[m % len(dst_ws)]
            if a == b:
                continue
            x = self.transfer_s(nbytes, a, b)
            wait = max(wait, x)
            for d, (u, v) in enumerate(((a, b), (b, a))):   # activation forward, gradient back
                for port in self.ports(u, v):
                    loads[port] = loads.get(port, 0.0) + x / L / self.port_slots(port)
                    burst.setdefault((d, port), set()).add(u)
        k = max((len(v) for v in burst.values()), default=1)
        return wait * (k + 1) / 2 if wait > 0 else 0.0

    @staticmethod
    def _one_f_one_b_cycles(rep_time: Sequence[float], waits: Sequence[float], flights: Sequence[int],
                            replicas: Sequence[int]) -> dict[tuple[int, int], float]:
        """``{(s, e): seconds per minibatch}``: each ``s``'s slowest 1F1B window of unreplicated stages."""
        out: dict[tuple[int, int], float] = {}
        for single, group in itertools.groupby(range(len(rep_time)), key=lambda s: replicas[s] == 1):
            run = list(group)
            s0, e0 = run[0], run[-1]
            if single and e0 > s0:  # a run s0..e0 of two or more unreplicated stages
                c = np.concatenate([[0.0], np.cumsum(rep_time[s0 : e0 + 1])])  # c[i]: compute of s0..s0+i-1
                x = np.concatenate([[0.0], np.cumsum(waits[s0:e0])])               # x[i]: cuts s0..s0+i-1
                n = np.asarray(flights[s0:e0 + 1], dtype=np.float64)
                idx = np.arange(e0 - s0 + 1)
                # window (i, j) relative to s0: compute c[j+1] - c[i], cuts i..j-1 both ways
                work = (c[None, 1:] - c[:-1, None]) + 2 * (x[None, :] - x[:, None])
                tokens = n[:, None] - n[None, :] + 1
                ok = (idx[None, :] > idx[:, None]) & (tokens >= 1)
                per = np.where(ok, work / np.where(ok, tokens, 1.0), -np.inf)
                best = per.argmax(axis=1)
                for i in range(e0 - s0):
                    if np.isfinite(per[i, best[i]]):
                        out[(s0 + i, s0 + int(best[i]))] = float(per[i, best[i]])
        return out
