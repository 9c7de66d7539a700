"""The policy registry: each :attr:`pipelab.methods.Method.weights` key and its policy factory.

A factory receives the method's own defaults (:meth:`pipelab.methods.Method.defaults`, schedule and
runtime) under the options given: the registry states each default once, nothing here restates it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

import pipelab.methods as methods
from pipelab.runtime.pipemare_math import PipeMareConfig
from pipelab.runtime.policies.base import NoStash, PolicyFactory, SingleVersion, Stashing, WeightPolicy
from pipelab.runtime.policies.delay import DelayedVersions
from pipelab.runtime.policies.pipemare import PipeMarePolicy
from pipelab.runtime.policies.wsp import HetPipePolicy
from pipelab.schedules.worker_view import StageReads, stage_delays


def _stash(method: str, opts: dict[str, Any]) -> PolicyFactory:
    return lambda params, stage, reads=None: Stashing(params, stage, reads,
                                                      vertical_sync=bool(opts["vertical_sync"]))


def _pipemare(method: str, opts: dict[str, Any]) -> PolicyFactory:
    cfg = PipeMareConfig(lr_reschedule=bool(opts["lr_reschedule"]),
                         discrepancy_correction=bool(opts["discrepancy_correction"]),
                         warmup_steps=int(opts["warmup_steps"]), decay=float(opts["decay"]),
                         decay_from_delay=bool(opts["decay_from_delay"]))
    sched = opts.get("schedule")
    # delays in optimizer steps, per stage, read from the schedule being executed
    taus: Mapping[int, tuple[int, int]] = opts.get("taus") or (
        stage_delays(sched) if sched is not None else {})

    def build(params: dict[str, nn.Parameter], stage: int, reads: StageReads | None = None) -> WeightPolicy:
        tf, tb = taus.get(stage, (0, 0))
        return PipeMarePolicy(params, stage, reads, tau_fwd=tf, tau_bwd=tb, config=cfg)
    return build


def _wsp(method: str, opts: dict[str, Any]) -> PolicyFactory:
    sched = opts.get("schedule")
    wave = int(opts.get("wave") or (sched.options.get("wave", 1) if sched is not None else 1))
    if sched is not None:
        V = len(sched.stage_ranks[0])
        if sched.minibatches % (V * wave):
            raise ValueError(f"hetpipe with {V} virtual workers and waves of {wave} minibatches needs steps "
                             f"a multiple of {V * wave} (every virtual worker ends on a full wave); got "
                             f"{sched.minibatches}")
    return lambda params, stage, reads=None: HetPipePolicy(params, stage, reads, wave=wave)


#: :attr:`pipelab.methods.Method.weights` -> ``make(method, options) -> factory``, where
#: ``factory(params, stage, reads)`` builds one stage's policy (``reads``: the versions the
#: schedule names for the stage's actions on this worker, :func:`pipelab.schedules.worker_view.stage_reads`)
POLICIES: dict[str, Callable[[str, dict[str, Any]], PolicyFactory]] = {
    "single": lambda method, opts: SingleVersion, "stash": _stash, "latest": lambda method, opts: NoStash,
    "delay": lambda method, opts: DelayedVersions, "pipemare": _pipemare, "wsp": _wsp}


def policy_for(method: str, options: dict[str, Any] | None = None) -> PolicyFactory:
    """The policy factory of ``method``; ``options`` (over the method's defaults) also carry
    ``"schedule"`` and ``"microbatches"``."""
    spec = methods.get(method)
    merged = {**spec.defaults(), **spec.defaults("runtime"), **(options or {})}
    return POLICIES[spec.weights](spec.name, merged)


def supported_methods() -> tuple[str, ...]:
    """Methods the runtime can execute (every registered method whose weight policy exists)."""
    return tuple(sorted(n for n in methods.names() if methods.get(n).weights in POLICIES))
