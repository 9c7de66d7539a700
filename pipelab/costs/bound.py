"""The steady-state bound: seconds per minibatch of an asynchronous pipeline, with its terms."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

import pipelab.metrics as metrics
from pipelab.costs.prices import Prices


@dataclass(frozen=True)
class SteadyState:
    """Terms of :meth:`CostModel.steady_state` (seconds per minibatch unless said otherwise)."""

    time_s: float                              # the prediction: the largest term below
    compute_s: tuple[float, ...]               # per stage: one replica's minibatch / replicas
    ports_s: dict[Hashable, float]             # per port: busy seconds per minibatch
    round_trip_s: tuple[float, ...]            # per stage: round trip / minibatches in flight
    transfer_wait_s: tuple[float, ...]         # per cut: mean seconds of one transfer incl. burst wait
    # per window (s, e) of adjacent unreplicated stages: its 1F1B cycle / minibatches it completes
    # (only the slowest window starting at each s, and only e > s)
    cycles_s: dict[tuple[int, int], float] = field(default_factory=dict)

    @property
    def bottleneck(self) -> str:
        """Which term sets the time: ``"compute s"``, ``"port (out, k, block)"``, ``"round trip s"`` or
        ``"1F1B cycle s-e"``."""
        for s, t in enumerate(self.compute_s):
            if t == self.time_s:
                return f"compute {s}"
        for p, t in self.ports_s.items():
            if t == self.time_s:
                return f"port {p}"
        for s, t in enumerate(self.round_trip_s):
            if t == self.time_s:
                return f"round trip {s}"
        for (s, e), t in self.cycles_s.items():
            if t == self.time_s:
                return f"1F1B cycle {s}-{e}"
        return "none"




@dataclass(frozen=True)
class SteadyStateBound(Prices):
    """The steady-state bound over :class:`Prices` (mixed into :class:`~pipelab.costs.CostModel`)."""

    def steady_state(self, ranges: Sequence[tuple[int, int]], workers: Sequence[Sequence[int]], *,
                     in_flight: Sequence[int] | None = None) -> SteadyState:
        """Seconds per minibatch of an asynchronous (PipeDream-style, no flush) pipeline, with the terms.

        Stage ``s`` runs layers ``ranges[s]`` on cluster workers ``workers[s]``; minibatch ``m`` goes
        to replica ``m % r_s`` of every stage (round-robin, PipeDream SOSP'19 §3.2). The time per
        minibatch is the largest of four lower bounds, each tight in its regime:

        * compute: ``T_s / r_s`` (one replica's minibatch with the overlapped all-reduce tail);
        * ports: each port's busy seconds per minibatch (:meth:`ports`), summing activations forward
          and gradients back of every cut, over the round-robin pairs of replicas, divided by the
          port's ``uplinks``;
        * round trip (Little's law): stage ``s`` keeps ``N_s = in_flight[s] * r_s`` minibatches
          between its forward and its backward, and one minibatch needs ``R_s`` seconds for that
          (compute of every later stage plus every transfer both ways), so time >= ``R_s / N_s``.
          Replicas of a stage pair their all-reduces and so run in lock-step; their ``k`` sends
          through one port leave in a burst, and a FIFO port serves a burst of ``k`` equal
          transfers with a mean wait of ``(k + 1) / 2`` transfers, which ``R_s`` uses;
        * 1F1B cycles (PipeDream SOSP'19 §3.2's one-forward-one-backward order, a max-plus cycle of the
          schedule): in a run of adjacent unreplicated stages, stage ``s`` runs ``B(m)`` then
          ``F(m + N_s)``; that forward travels down to stage ``e``, whose next backward is
          ``B(m + N_s - N_e + 1)``, which travels back up to ``s``. So stages ``s..e`` complete
          ``N_s - N_e + 1`` minibatches per (their compute + both ways of their cuts), and the time is
          at least that ratio for every window. ``e = s`` is the compute bound and ``e = P - 1`` the
          round trip; the windows in between bind when transfers are long next to the stages'
          compute (two slow adjacent stages over a slow link). Replicated stages are left out: their
          round-robin order breaks the single cycle into several (the simulator's business).
        """
        P = len(ranges)
        if P == 0 or len(workers) != P:
            raise ValueError(f"steady_state needs one worker list per stage; got {P} ranges and "
                             f"{len(workers)} worker lists")
        compute, rep_time = [], []
        for (a, b), ws in zip(ranges, workers):
            if not ws:
                raise ValueError(f"stage [{a}, {b}) has no workers")
            t = self.replica_time_s(a, b, ws)
            speed = min(self.cluster.speed(w) for w in ws)
            compute.append(t / len(ws))
            rep_time.append(float(self.pf[b] - self.pf[a] + self.pb[b] - self.pb[a]) / speed)
        loads: dict[Hashable, float] = {}
        waits = []
        for s in range(P - 1):
            src_ws, dst_ws = list(workers[s]), list(workers[s + 1])
            nbytes = self.cut_bytes(ranges[s][1] - 1)
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
            # lock-step replicas: a burst of k senders per port (one sender: no burst)
            k = max((len(v) for v in burst.values()), default=1)
            waits.append(wait * (k + 1) / 2 if wait > 0 else 0.0)
        rt = []
        flights = list(in_flight) if in_flight is not None else [
            metrics.in_flight([len(w) for w in workers], s) for s in range(P)]
        for s in range(P):
            r = sum(rep_time[s:]) + 2 * sum(waits[s:])
            rt.append(r / (flights[s] * len(workers[s])))
        cycles = self._one_f_one_b_cycles(rep_time, waits, flights, [len(w) for w in workers])
        time = max([*compute, *loads.values(), *rt, *cycles.values()])
        return SteadyState(time_s=time, compute_s=tuple(compute), ports_s=dict(loads),
                           round_trip_s=tuple(rt), transfer_wait_s=tuple(waits), cycles_s=cycles)

    @staticmethod
    def _one_f_one_b_cycles(rep_time: Sequence[float], waits: Sequence[float], flights: Sequence[int],
                            replicas: Sequence[int]) -> dict[tuple[int, int], float]:
        """The slowest 1F1B cycle :meth:`steady_state` bounds by, per starting stage ``s`` of a window
        ``s..e`` (``e > s``) of adjacent unreplicated stages: ``{(s, e): seconds per minibatch}``.

        Window ``s..e`` takes ``sum_{s..e} compute + 2 sum_{s..e-1} transfer`` and completes
        ``N_s - N_e + 1`` minibatches (a window completing none bounds nothing and is skipped).
        Vectorised: ``O(P^2)`` numbers in a handful of numpy calls per run of unreplicated stages.
        """
        out: dict[tuple[int, int], float] = {}
        P, s0 = len(rep_time), 0
        while s0 < P:
            if replicas[s0] != 1:
                s0 += 1
                continue
            e0 = s0
            while e0 + 1 < P and replicas[e0 + 1] == 1:
                e0 += 1
            if e0 > s0:  # a run s0..e0 of two or more unreplicated stages
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
            s0 = e0 + 1
        return out
