"""Simulate a schedule on a cluster: ``pl.simulate(plan, profile, cluster, method=...) -> SimResult``."""

from __future__ import annotations

from pipelab.costs import CostModel
from pipelab.partition.virtual import virtual_plan
from pipelab.schedules.dataflow import Costs, Deadlock, UnitCosts
from pipelab.sim.simulate import ProfileCosts, SimResult, simulate, simulate_schedule

__all__ = ["CostModel", "Costs", "Deadlock", "ProfileCosts", "SimResult", "UnitCosts", "simulate",
           "simulate_schedule", "virtual_plan"]
