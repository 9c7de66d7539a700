"""Calibrations for tests: a bare record for unit tests (this host, gloo, 2 workers, no runtime work),
and the record of the session's one real calibration (:class:`CalibrationRun`, made in conftest.py)."""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pipelab.hostload import HostLoad
from pipelab.measured import Calibration


def bare_calibration(**kw: object) -> Calibration:
    """A :class:`Calibration` of this host with round figures and no per-action or optimizer work;
    ``kw`` replaces any field."""
    base: dict[str, object] = dict(
        host=socket.gethostname(), backend="gloo", device="cpu:test", date="2026-11-25T00:00:00+00:00",
        torch="2.14.1", cores=2, workers=2, p2p_latency_s=50e-6, p2p_bandwidth=2e9,
        allreduce_latency_s=80e-6, allreduce_bandwidth=1e9, overhead_s={}, optimizer_s={},
        memory_bandwidth=1e10,
    )
    base.update(kw)
    return Calibration(**base)  # type: ignore[arg-type]


@dataclass(frozen=True)
class CalibrationRun:
    """One ``pipelab calibrate -o path --quiet`` of this machine: its output file, the finished process
    (None when it ran past conftest's ``CALIBRATION_TIMEOUT_S``) and the host's load meanwhile."""

    path: Path
    proc: subprocess.CompletedProcess[str] | None
    load: HostLoad | None
