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


def _child(args: tuple[int, int, bool | None], out: mp.Queue) -> None:   # type: ignore[type-arg]
    before = sorted(os.sched_getaffinity(0))
    got = pin_worker(*args)
    out.put((before, got, sorted(os.sched_getaffinity(0))))


def _in_child(local_rank: int, local_workers: int,
              mode: bool | None) -> tuple[list[int], int | None, list[int]]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=((local_rank, local_workers, mode), q))
    p.start()
    try:
        return q.get(timeout=60)  # type: ignore[no-any-return]
    finally:
        p.join(timeout=30)


def test_each_local_rank_gets_its_own_core_when_the_workers_fit() -> None:
    cores = sorted(os.sched_getaffinity(0))
    for rank in range(min(len(cores), 2)):
        before, got, after = _in_child(rank, min(len(cores), 2), None)
        assert before == cores and got == cores[rank] and after == [cores[rank]]


def test_the_default_leaves_more_workers_than_cores_alone_and_true_pins_round_robin() -> None:
    cores = sorted(os.sched_getaffinity(0))
    n = len(cores) + 1
    before, got, after = _in_child(0, n, None)
    assert got is None and after == before
    before, got, after = _in_child(len(cores), n, True)      # wraps round to the first core
    assert got == cores[0] and after == [cores[0]]
    before, got, after = _in_child(0, 1, False)
    assert got is None and after == before


def test_pin_cores_is_a_checked_runtime_option() -> None:
    assert RuntimeOptions.from_options("gpipe", {"pin_cores": False}).pin_cores is False
    assert RuntimeOptions.from_options("gpipe", {}).pin_cores is None
    with pytest.raises(ValueError, match="pin_cores='yes' must be True or False"):
        RuntimeOptions.from_options("gpipe", {"pin_cores": "yes"})
    assert "pin_cores" in pl.methods.get("1f1b-flush").option_names
