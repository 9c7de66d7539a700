"""tests/timing.py's rule: pass when the check holds, skip on a busy machine, fail on a quiet one."""

from __future__ import annotations

import pytest
from timing import holds_or_skip

from pipelab.hostload import HostLoad

QUIET = HostLoad(10.0, 2, 2.0, 1.8, samples=40)      # others: 1% of the cores' time
BUSY = HostLoad(10.0, 2, 18.0, 8.0, samples=40)      # others: 50%


def test_a_check_that_holds_passes_whatever_the_load() -> None:
    holds_or_skip(True, BUSY, "unused")
    holds_or_skip(True, None, "unused")


def test_a_check_that_fails_on_a_busy_machine_skips_saying_why() -> None:
    with pytest.raises(pytest.skip.Exception, match=r"cannot decide on a busy machine \(other processes "
                                                    r"took 50% of the 2 cores' time.*\): took 12 s"):
        holds_or_skip(False, BUSY, "took 12 s")


def test_a_check_that_fails_on_a_quiet_or_unsampled_machine_fails() -> None:
    for load in (QUIET, None, HostLoad(10.0, 2, 0.0, 0.0, 0, sampled=False)):
        with pytest.raises(AssertionError, match="took 12 s"):
            holds_or_skip(False, load, "took 12 s")
