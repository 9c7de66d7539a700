"""The arguments of a training run as one record: ``train``, ``launch``, the job file and the CLI share it.

Invariant: each knob of a run is declared once, as a field of :class:`TrainArgs` with its default,
its one-line meaning and its check; ``train(**kw)``/``launch(**kw)`` build the record
(:meth:`TrainArgs.of`), a job file's keys map onto its fields (:data:`JOB_FIELDS`, anything else is
refused listing them), and keywords that name no field are the method's and the runtime's options
(checked by :func:`pipelab.runtime.options.split_options` and the schedule builders, which list theirs).
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

import torch

from pipelab.partition.plan import Plan
from pipelab.schedules.actions import Schedule

BACKENDS = ("gloo", "nccl", "local")


def _knob(doc: str, default: Any = MISSING, *, job: bool = True, factory: Any = MISSING) -> Any:
    """A field of :class:`TrainArgs`: its meaning, default and whether a job file may set it."""
    meta = {"doc": doc, "job": job}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class TrainArgs:
    """Every argument of ``train``/``launch``: fields are the named knobs, ``options`` the method's and
    the runtime's (``compression=``, ``checkpoint_every=``, ``chunks=``...)."""

    model_fn: Callable[[], torch.nn.Module] = _knob("returns the nn.Module to train; every worker calls it "
                                                    "with the same seed")
    plan: Plan = _knob("the Plan: which layers each stage runs on which workers")
    data: Callable[[], Iterable[Any]] = _knob("returns an iterable of (inputs, targets) minibatches, the "
                                              "same sequence on every call")
    loss_fn: Callable[[Any, Any], torch.Tensor] = _knob("loss_fn(outputs, targets): the mean loss, a scalar")
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer] = _knob(
        "optimizer(params): one stage's torch optimizer")
    steps: int = _knob("minibatches to train")
    method: str | None = _knob("the training method (pl.methods.METHODS); None: the schedule's", None)
    microbatches: int | None = _knob("microbatches per minibatch (None: one per stage)", None)
    backend: str = _knob("'gloo' (CPU processes), 'nccl' (one GPU per worker) or 'local' (the reference "
                         "executor in this process)", "gloo")
    seed: int = _knob("the seed every worker builds the model with", 0)
    timeout: float = _knob("seconds the run may take before every worker is stopped", 300.0)
    schedule: Schedule | None = _knob("a prebuilt schedule instead of pl.schedules.build(method, plan)",
                                      None, job=False)
    port: int | None = _knob("the rendezvous port (None: a free one)", None)
    master_addr: str = _knob("the rendezvous address", "127.0.0.1")
    trace_kwargs: Mapping[str, Any] = _knob("fx tracing settings (leaf_modules, depth)", factory=dict)
    trace_path: str | Path | None = _knob("also save the measured trace as JSON lines here", None, job=False)
    progress: bool | None = _knob("a progress bar (None: train() shows one, launch() does not)", None,
                                  job=False)
    stream: bool = _knob("send events as they happen (False: each worker's at its end)", True, job=False)
    max_per_core: int = _knob("CPU worker processes (gloo) allowed per usable core; more are refused", 4)
    options: Mapping[str, Any] = _knob("the method's and the runtime's options", factory=dict)

    @classmethod
    def of(cls, **kwargs: Any) -> TrainArgs:
        """From ``train``'s keyword arguments: those that name no field are options (checked later)."""
        names = set(field_names()) - {"options"}
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is MISSING and f.default_factory is MISSING and f.name not in kwargs]
        if required:
            raise TypeError(f"train() lacks {', '.join(n + '=' for n in required)} (see help(pl.train))")
        return cls(**{k: v for k, v in kwargs.items() if k in names},
                   options={**dict(kwargs.get("options") or {}),
                            **{k: v for k, v in kwargs.items() if k not in names and k != "options"}})

    def check(self) -> None:
        """Raise a clear error for arguments of the wrong form (before anything is built)."""
        backend, microbatches, plan = self.backend, self.microbatches, self.plan
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}; use one of {BACKENDS}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps={self.steps!r}; train for at least one minibatch (an int >= 1)")
        if microbatches is not None and (isinstance(microbatches, bool) or not isinstance(microbatches, int)
                                         or microbatches < 1):
            raise ValueError(f"microbatches={microbatches!r} must be an int >= 1 (or None: one per stage)")
        if not isinstance(self.timeout, (int, float)) or self.timeout <= 0:
            raise ValueError(f"timeout={self.timeout} must be > 0 seconds")
        per_core = self.max_per_core
        if isinstance(per_core, bool) or not isinstance(per_core, int) or per_core < 1:
            raise ValueError(f"max_per_core={self.max_per_core!r} must be an int >= 1")
        if not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r} must be an int")
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be a pipelab Plan, got {type(plan).__name__}")
        for name in ("model_fn", "data", "loss_fn", "optimizer"):
            fn = getattr(self, name)
            if not callable(fn):
                raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
            try:
                if backend != "local":
                    pickle.dumps(fn)
            except Exception as exc:
                raise ValueError(f"{name} cannot be sent to worker processes ({type(exc).__name__}: {exc}); "
                                 "pass an importable top-level function (not a lambda or a closure; in a "
                                 "notebook put it in a .py module), or functools.partial of one") from None
        if backend == "nccl":
            n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if n_gpu < plan.num_devices:
                raise ValueError(f"backend='nccl' needs one CUDA GPU per worker device "
                                 f"({plan.num_devices}) but this machine has {n_gpu}; use backend='gloo' "
                                 "on CPU")


def field_names() -> tuple[str, ...]:
    """The fields of :class:`TrainArgs`, in order."""
    return tuple(f.name for f in dataclasses.fields(TrainArgs))


#: the keys a job file may hold: the fields a job sets, plus ``out`` (its output folder)
JOB_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainArgs) if f.metadata["job"])


def describe_fields() -> str:
    """One line per knob: name, default and meaning (for docstrings and ``--help``)."""
    lines = []
    for f in dataclasses.fields(TrainArgs):
        d = ("required" if f.default is MISSING and f.default_factory is MISSING
             else f"default {f.default!r}" if f.default is not MISSING else "default empty")
        lines.append(f"    {f.name}: {f.metadata['doc']} ({d})")
    return "\n".join(lines)


def signature(first: tuple[str, ...] = ("model_fn", "plan")) -> inspect.Signature:
    """``train``'s signature from the record: ``first`` positional, the other fields keyword-only,
    then ``**options``; IDEs and ``help()`` show it."""
    params = []
    for f in dataclasses.fields(TrainArgs):
        if f.name == "options":
            continue
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if f.name in first else inspect.Parameter.KEYWORD_ONLY
        default = (f.default if f.default is not MISSING else
                   inspect.Parameter.empty if f.default_factory is MISSING else None)
        params.append(inspect.Parameter(f.name, kind, default=default))
    params.append(inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)
