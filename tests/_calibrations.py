"""A bare calibrated record for unit tests: this host, gloo, 2 workers, no runtime work."""

from __future__ import annotations

import socket

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
