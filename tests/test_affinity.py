"""One core per CPU worker (``pipelab.runtime.affinity``): which core each local rank gets, when the
default pins and when it does not, and that a bad ``pin_cores=`` is refused. Pinning happens in a
child process, never in the test process."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest

import pipelab as pl
from pipelab.runtime.affinity import pin_worker
from pipelab.runtime.options import RuntimeOptions

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")


Case = tuple[int, int, "bool | None"]          # pin_worker's local_rank, local_workers, mode
Result = tuple[list[int], "int | None", list[int]]   # the cores before, pin_worker's core, the cores after


def _child(cases: list[Case], out: mp.Queue) -> None:   # type: ignore[type-arg]
    original = os.sched_getaffinity(0)
    results = []
    for case in cases:          # each case from the process's own affinity, as a new worker starts
        os.sched_setaffinity(0, original)
        before = sorted(os.sched_getaffinity(0))
        got = pin_worker(*case)
        results.append((before, got, sorted(os.sched_getaffinity(0))))
    out.put(results)


def _in_child(*cases: Case) -> list[Result]:
    """``pin_worker`` of each case in one spawned child (one process start for all of them)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(list(cases), q))
    p.start()
    try:
        return q.get(timeout=60)  # type: ignore[no-any-return]
    finally:
        p.join(timeout=30)


def test_each_local_rank_gets_its_own_core_when_the_workers_fit() -> None:
    cores = sorted(os.sched_getaffinity(0))
    ranks = range(min(len(cores), 2))
    results = _in_child(*[(rank, min(len(cores), 2), None) for rank in ranks])
    assert len(results) == len(ranks)
    for rank, (before, got, after) in zip(ranks, results):
        assert before == cores and got == cores[rank] and after == [cores[rank]]


def test_the_default_leaves_more_workers_than_cores_alone_and_true_pins_round_robin() -> None:
    cores = sorted(os.sched_getaffinity(0))
    n = len(cores) + 1
    (b0, got0, a0), (b1, got1, a1), (b2, got2, a2) = _in_child(
        (0, n, None), (len(cores), n, True), (0, 1, False))
    assert b0 == b1 == b2 == cores
    assert got0 is None and a0 == b0
    assert got1 == cores[0] and a1 == [cores[0]]      # wraps round to the first core
    assert got2 is None and a2 == b2


def test_pin_cores_is_a_checked_runtime_option() -> None:
    assert RuntimeOptions.from_options("gpipe", {"pin_cores": False}).pin_cores is False
    assert RuntimeOptions.from_options("gpipe", {}).pin_cores is None
    with pytest.raises(ValueError, match="pin_cores='yes' must be True or False"):
        RuntimeOptions.from_options("gpipe", {"pin_cores": "yes"})
    assert "pin_cores" in pl.methods.get("1f1b-flush").option_names
