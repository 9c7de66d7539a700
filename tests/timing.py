"""Timing checks on a shared machine: each one decides, or skips saying why; a busy machine never fails it.

A check whose verdict depends on how fast this machine is at that moment (a measured time against a
bound, a wall-clock limit) runs inside :class:`pipelab.hostload.HostLoadSampler`. When the check holds,
it passes. When it does not and other processes held over ``pipelab.hostload.BUSY_SHARE`` of the cores'
time meanwhile, the test cannot tell a slow machine from a wrong result: it skips with the load it saw.
When it does not hold on a machine that was not busy, it fails.
"""

from __future__ import annotations

import pytest

from pipelab.hostload import HostLoad


def holds_or_skip(ok: bool, load: HostLoad | None, message: str) -> None:
    """Pass when ``ok``; skip when not and ``load`` says the machine was busy; fail otherwise."""
    if ok:
        return
    if load is not None and load.busy:
        pytest.skip(f"cannot decide on a busy machine ({load.describe()}): {message}")
    raise AssertionError(message)
