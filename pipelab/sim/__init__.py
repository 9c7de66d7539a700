"""Simulate a schedule on a cluster: ``pl.simulate(plan, profile, cluster, method=...) -> SimResult``.

- :mod:`pipelab.schedules.dataflow` — discrete-event execution of a schedule (blocking actions, async sends);
- :mod:`pipelab.sim.simulate` — ``simulate``, ``simulate_schedule``, ``SimResult`` (metrics, memory).

The cost model it prices actions with is :mod:`pipelab.costs` (one layer below, shared with the
partitioners); ``CostModel`` is re-exported here for convenience.
"""

from __future__ import annotations

from pipelab.costs import CostModel
from pipelab.schedules.dataflow import Costs, Deadlock, UnitCosts
from pipelab.sim.simulate import ProfileCosts, SimResult, simulate, simulate_schedule, virtual_plan

__all__ = ["CostModel", "Costs", "Deadlock", "ProfileCosts", "SimResult", "UnitCosts", "simulate",
           "simulate_schedule", "virtual_plan"]
