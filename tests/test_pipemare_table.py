"""PipeMare's characterization table (Yang et al., MLSys'21, Table 1) against pipelab's own schedules
and a real run.

For stage ``i`` (from 1) of ``P`` with ``N`` microbatches per minibatch the table says

=========  =======================  ==========  ============  ==================
method     tau_fwd,i                tau_bkwd,i  utilization   weight memory
=========  =======================  ==========  ============  ==================
PipeDream  ceil((2(P-i)+1)/N)       tau_fwd,i   1.0           sum |w_i| tau_fwd,i
GPipe      0                        0           N/(N+P-1)     W
PipeMare   ceil((2(P-i)+1)/N)       0           1.0           W
=========  =======================  ==========  ============  ==================

with tau counted in optimizer steps between reading the weights and applying the gradient.
pipelab counts the same thing on the schedules it builds and runs (``stage_delays``: updates
between the version an action reads and the update its gradient lands in), and gets a smaller
number. The tests below read every entry off the built schedules for P in 2..8, N in 1..8, name
each difference and its size, and check that a real run measures pipelab's count:

* **stage indexing**: the table counts ``i`` from 1, pipelab's stages ``s`` from 0 (``i = s + 1``);
* **the time model**: a microbatch's round trip from its forward to its backward on stage ``i`` is
  ``R = 2(P-i)+1`` unit slots in both (checked below on the unit-cost timing of the built schedule),
  but the table's stage runs a forward *and* a backward in every slot, so it updates once every
  ``N`` slots and counts the update of the forward's own slot: ``ceil(R / N)``; 1F1B alternates one
  action per slot, so it updates once every ``2N`` slots, none in the forward's slot:
  ``ceil((R - 1) / (2N)) = ceil((P-i)/N)`` (``P - 1 - s`` at ``N = 1``). The difference is
  ``ceil((2(P-i)+1)/N) - ceil((P-i)/N)``: ``P - i + 1`` at ``N = 1``, at most 1 once ``N > 2(P-i)``;
* **warm-up**: the first minibatches of a run read version 0 and have smaller delays; both counts
  are the steady-state maximum (pipelab's ``stage_delays`` takes the maximum over the run);
* **weight memory**: pipelab counts the versions a stage holds *including* the newest (the master):
  PipeDream holds ``tau_fwd + 1`` copies where the table charges ``tau_fwd``; PipeMare's
  discrepancy correction keeps one more weight-sized buffer (the moving average of the weight
  change) that the table's ``W`` leaves out.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import test_runtime_async_helpers as H
import torch

from pipelab.partition.plan import Plan
from pipelab.runtime import train
from pipelab.schedules import build, validate
from pipelab.schedules.dataflow import UnitCosts
from pipelab.schedules.worker_view import stage_delays
from pipelab.sim.simulate import simulate_schedule

PS = range(2, 9)
NS = range(1, 9)


def table_tau(P: int, i: int, N: int) -> int:
    """PipeMare Table 1's tau_fwd,i, stage ``i`` counted from 1."""
    return math.ceil((2 * (P - i) + 1) / N)


def pipelab_tau(P: int, s: int, N: int) -> int:
    """pipelab's closed form on a straight 1F1B pipeline, stage ``s`` counted from 0."""
    return math.ceil((P - 1 - s) / N)


def round_trips(sched: Any) -> dict[int, int]:
    """Per stage, the unit slots from a microbatch's F start to its B start (F = B = 1 unit) in
    steady state: the median over the run's microbatches (the fill's first ones wait longer)."""
    tr = simulate_schedule(sched, UnitCosts(f=1.0, b=1.0, w=0.0)).trace
    f = {(e.stage, e.microbatch): e.start_s for e in tr.compute_events() if e.kind == "F"}
    per: dict[int, list[int]] = {}
    for e in tr.compute_events():
        if e.kind == "B":
            per.setdefault(e.stage, []).append(round(e.start_s - f[(e.stage, e.microbatch)]))
    return {s: sorted(v)[len(v) // 2] for s, v in per.items()}


def gpipe_delays(P: int, N: int, K: int = 3) -> dict[int, tuple[int, int]]:
    """GPipe's delays read off its schedule: updates of the stage between each F (B) of minibatch
    ``k`` and ``k``'s own update (a flushed schedule records no versions: the count is its order)."""
    sched = build("gpipe", P, microbatches=N, minibatches=K)
    out: dict[int, tuple[int, int]] = {}
    for acts in sched.actions:
        done: dict[int, int] = {}
        for a in acts:
            if a.kind == "U":
                done[a.stage] = done.get(a.stage, 0) + 1
                continue
            k = a.microbatch // N
            tau = k - done.get(a.stage, 0)     # updates after this read and before U(k)
            tf, tb = out.get(a.stage, (0, 0))
            out[a.stage] = (max(tf, tau), tb) if a.kind == "F" else (tf, max(tb, tau))
    return out


@pytest.mark.parametrize("P", PS)
def test_delays_of_the_built_schedules_against_the_table(P: int) -> None:
    for N in NS:
        mare, dream, gpipe = (build(m, P, microbatches=N) for m in ("pipemare", "pipedream", "gpipe"))
        for s in (mare, dream):
            validate(s)
            assert s.microbatches == N
        got_mare, got_dream = stage_delays(mare), stage_delays(dream)
        for s in range(P):
            i = s + 1                                  # difference 1: the table counts stages from 1
            ours, theirs = pipelab_tau(P, s, N), table_tau(P, i, N)
            assert got_mare[s] == (ours, 0), (P, N, s)           # tau_bkwd = 0: B reads the newest
            assert got_dream[s] == (ours, ours), (P, N, s)       # tau_bkwd = tau_fwd: B reads F's stash
            # difference 2, the time model, and its size
            gap = theirs - ours
            assert gap == math.ceil((2 * (P - i) + 1) / N) - math.ceil((P - i) / N) >= 0
            if N == 1:
                assert gap == P - i + 1
            if N > 2 * (P - i):
                assert gap <= 1
        assert gpipe.versions is None               # one version: every read is of the newest
        assert gpipe_delays(P, N) == {s: (0, 0) for s in range(P)}
        # the same round trip in both: R = 2(P - i) + 1 slots; the table updates every N slots
        # counting the forward's own, 1F1B every 2N slots
        R = round_trips(mare)
        for s in range(P):
            assert R[s] == 2 * (P - (s + 1)) + 1
            assert table_tau(P, s + 1, N) == math.ceil(R[s] / N)
            assert got_mare[s][0] == math.ceil((R[s] - 1) / (2 * N))


@pytest.mark.parametrize("P", PS)
def test_utilization_and_weight_versions_of_the_built_schedules(P: int) -> None:
    unit = UnitCosts(f=1.0, b=1.0, w=0.0)
    for N in NS:
        gpipe = simulate_schedule(build("gpipe", P, microbatches=N, minibatches=1), unit)
        assert gpipe.utilization == pytest.approx([N / (N + P - 1)] * P)
        for m in ("pipemare", "pipedream"):
            sched = build(m, P, microbatches=N)
            # steady state (warm-up and drain excluded): every stage busy all the time
            assert simulate_schedule(sched, unit).utilization == pytest.approx([1.0] * P), (m, P, N)
            held = [sched.versions_held(s) for s in range(P)]
            if m == "pipemare":
                assert held == [1] * P               # W (T2's moving average is one more buffer)
            else:
                # pipelab counts the newest version too: tau_fwd + 1 copies, the table tau_fwd (its tau)
                assert held == [pipelab_tau(P, s, N) + 1 for s in range(P)], (P, N, held)
                table = [table_tau(P, s + 1, N) for s in range(P)]
                assert all(t >= h - 1 for t, h in zip(table, held))


# ---------------------------------------------------------------------- a real run reads the same delays
def delays_from_trace(trace: Any, N: int) -> dict[int, tuple[int, int]]:
    """Per stage ``(tau_fwd, tau_bwd)`` from the versions a run's events recorded (not the schedule's):
    a minibatch's earliest F (B) version against the version its update produced, minus one."""
    f: dict[tuple[int, int], int] = {}
    b: dict[tuple[int, int], int] = {}
    u: dict[tuple[int, int], int] = {}
    for e in trace.compute_events():
        key = (e.stage, e.microbatch if e.kind == "U" else e.microbatch // N)
        if e.kind == "F":
            f[key] = min(e.weight_version, f.get(key, e.weight_version))
        elif e.kind == "B":
            b[key] = min(e.weight_version, b.get(key, e.weight_version))
        elif e.kind == "U":
            u[key] = e.weight_version
    out: dict[int, tuple[int, int]] = {}
    for (s, k), v in u.items():
        tf, tb = out.get(s, (0, 0))
        out[s] = (max(tf, v - 1 - f[(s, k)]), max(tb, v - 1 - b[(s, k)]))
    return out


def _run(method: str, plan: Plan, N: int, steps: int, backend: str, **kw: Any) -> Any:
    return train(H.mlp, plan, method=method, data=H.data, loss_fn=H.loss_fn, optimizer=H.sgd, steps=steps,
                 microbatches=N, backend=backend, progress=False, timeout=120, **kw)


@pytest.mark.timeout(180)
def test_a_real_run_measures_pipelabs_delays_not_the_tables() -> None:
    P, N, steps = 3, 2, 7
    plan = Plan.from_boundaries(5, [1, 3])
    g = _run("pipemare", plan, N, steps, "gloo", warmup_steps=4)
    want = {s: (pipelab_tau(P, s, N), 0) for s in range(P)}
    assert delays_from_trace(g.trace, N) == want == stage_delays(g.schedule)
    assert want != {s: (table_tau(P, s + 1, N), 0) for s in range(P)}
    assert g.versions_held == {s: 1 for s in range(P)}
    # every B read the newest version: as many updates of its stage as ran before it
    done: dict[int, int] = {}
    for e in sorted(g.trace.compute_events(), key=lambda e: (e.worker, e.step)):
        if e.kind == "U":
            done[e.stage] = done.get(e.stage, 0) + 1
        elif e.kind == "B":
            assert e.weight_version == done.get(e.stage, 0)
    # the processes compute the reference executor's weights
    loc = _run("pipemare", plan, N, steps, "local", warmup_steps=4)
    assert H.max_diff(g.state_dict(), loc.state_dict()) == 0.0


def test_pipedream_with_n_microbatches_stashes_per_microbatch_in_the_runtime() -> None:
    P, N = 3, 2
    plan = Plan.from_boundaries(5, [1, 3])
    r = _run("pipedream", plan, N, 7, "local")
    assert delays_from_trace(r.trace, N) == {s: (pipelab_tau(P, s, N),) * 2 for s in range(P)}
    f_of = {(e.stage, e.microbatch): e.weight_version for e in r.trace.compute_events() if e.kind == "F"}
    for e in r.trace.compute_events():
        if e.kind == "B":
            assert e.weight_version == f_of[(e.stage, e.microbatch)]
    assert r.versions_held == {s: pipelab_tau(P, s, N) + 1 for s in range(P)}
    assert all(torch.isfinite(torch.tensor(r.losses)))
