"""pipelab: profile, partition, simulate, run and watch pipeline-parallel DNN training.

The data flow (each arrow a pure function or a process launch, each box a frozen record)::

    nn.Module --profile()--> Profile --partition()--> Plan --schedules.build()--> Schedule
                                                        |                            |
                           Cluster ---------------------+--> simulate() / train() --> Trace --> views

Public names are imported lazily, so ``import pipelab`` is cheap.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public names that are modules rather than objects inside a module
_MODULES = ("hostload", "llm", "metrics", "models", "planner", "schedules", "torch_bridge", "views",
            "widgets")
#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Profile": "pipelab.profile.records", "Layer": "pipelab.profile.records",
    "profile": "pipelab.profile.measure",
    "Cluster": "pipelab.cluster", "Calibration": "pipelab.cluster", "calibrate": "pipelab.calibrate",
    "Plan": "pipelab.partition.plan", "Stage": "pipelab.partition.plan", "partition": "pipelab.partition",
    "Action": "pipelab.schedules.actions", "Schedule": "pipelab.schedules.actions",
    "simulate": "pipelab.sim", "SimResult": "pipelab.sim", "explain": "pipelab.explain",
    "plan": "pipelab.planner", "PlanTable": "pipelab.planner", "confirm": "pipelab.planner",
    "simulate_llm": "pipelab.sim.llm", "LlmResult": "pipelab.sim.llm",
    "plan_llm": "pipelab.planner.llm", "LlmPlanTable": "pipelab.planner.llm",
    "Trace": "pipelab.trace", "Event": "pipelab.trace", "train": "pipelab.runtime",
    "launch": "pipelab.runtime",
    **{m: f"pipelab.{m}" for m in _MODULES},
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import public names on first use."""
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'pipelab' has no attribute {name!r}")
    module = importlib.import_module(mod)
    # a package exported under its own name is the module, unless it defines a function of that name
    value = getattr(module, name, module) if mod.endswith("." + name) else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


# ``pl.partition`` etc. are functions named like subpackages: importing a submodule sets the package
# attribute to the subpackage, shadowing the function, so those modules are made callable.
_CALLABLE_SUBPACKAGES: dict[str, tuple[str, str]] = {
    "pipelab.partition": ("pipelab.partition", "partition"),
    "pipelab.profile": ("pipelab.profile.measure", "profile"),
    "pipelab.calibrate": ("pipelab.calibrate", "calibrate"),
    "pipelab.explain": ("pipelab.explain", "explain"),
}


class _CallablePackage(types.ModuleType):
    """A subpackage that can also be called as its main function (``pl.partition(...)``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module, attr = _CALLABLE_SUBPACKAGES[self.__name__]
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)


class _Package(types.ModuleType):
    """pipelab's own module type: keeps ``pl.partition``/``pl.profile`` callable whatever was imported."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and value.__name__ in _CALLABLE_SUBPACKAGES:
            value.__class__ = _CallablePackage
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from pipelab import metrics, models, planner, schedules, torch_bridge, views, widgets  # noqa: F401
    from pipelab.calibrate import calibrate  # noqa: F401
    from pipelab.cluster import Calibration, Cluster  # noqa: F401
    from pipelab.explain import explain  # noqa: F401
    from pipelab.partition import partition  # noqa: F401
    from pipelab.partition.plan import Plan, Stage  # noqa: F401
    from pipelab.planner import PlanTable, confirm, plan  # noqa: F401
    from pipelab.planner.llm import LlmPlanTable, plan_llm  # noqa: F401
    from pipelab.profile.measure import profile  # noqa: F401
    from pipelab.profile.records import Layer, Profile  # noqa: F401
    from pipelab.runtime.launch import launch, train  # noqa: F401
    from pipelab.schedules.actions import Action, Schedule  # noqa: F401
    from pipelab.sim.llm import LlmResult, simulate_llm  # noqa: F401
    from pipelab.sim.simulate import SimResult, simulate  # noqa: F401
    from pipelab.trace import Event, Trace  # noqa: F401
