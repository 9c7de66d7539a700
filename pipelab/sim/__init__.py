"""Simulate a schedule on a cluster: ``pl.simulate(plan, profile, cluster, method=...) -> SimResult``.

- :mod:`pipelab.sim.costs` — the cost model shared with the partitioners;
- :mod:`pipelab.sim.engine` — discrete-event execution of a schedule (blocking actions, async sends);
- :mod:`pipelab.sim.simulate` — ``simulate``, ``simulate_schedule``, ``SimResult`` (metrics, memory).

Names are imported lazily so that ``pipelab.partition`` can use the cost model without pulling in
the schedules (which themselves import the Plan record).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "simulate": "pipelab.sim.simulate", "simulate_schedule": "pipelab.sim.simulate",
    "SimResult": "pipelab.sim.simulate", "ProfileCosts": "pipelab.sim.simulate",
    "virtual_plan": "pipelab.sim.simulate", "Costs": "pipelab.sim.engine", "UnitCosts": "pipelab.sim.engine",
    "Deadlock": "pipelab.sim.engine", "CostModel": "pipelab.sim.costs",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import public names on first use."""
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'pipelab.sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # pragma: no cover
    from pipelab.sim.costs import CostModel  # noqa: F401
    from pipelab.sim.engine import Costs, Deadlock, UnitCosts  # noqa: F401
    from pipelab.sim.simulate import ProfileCosts, SimResult, simulate, simulate_schedule, virtual_plan  # noqa: F401
