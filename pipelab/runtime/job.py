"""The Job record (everything a worker needs), prepared and checked in the parent.

Invariant: everything checkable before a process starts is checked in :func:`prepare` (plan vs
model, schedule vs plan, the first minibatch vs the model, deterministic ``data()``, backend,
port), so bad input gives a clear error, never a hang. Callables travel by reference: importable
top-level functions, in a ``job.json`` ``"module:function"`` or ``{"fn": ..., "kwargs": {...}}``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import json
import os
import socket
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import pipelab.methods as methods
from pipelab.batching import check_divides
from pipelab.graph import layer_nodes, rebuild_output, trace
from pipelab.partition.plan import Plan
from pipelab.runtime.args import JOB_FIELDS, TrainArgs
from pipelab.runtime.checkpoint_files import check_compatible, choose_resume
from pipelab.runtime.coalesce import check_method
from pipelab.runtime.comm import TensorSpec, boundary_specs
from pipelab.runtime.lifeline import check_port
from pipelab.runtime.options import RuntimeOptions, split_options
from pipelab.runtime.policies import policy_for
from pipelab.runtime.tensor_group import check_model, check_processes, check_ties, layout
from pipelab.runtime.ties import TieGroup, check_schedule, check_tie_method, tie_groups
from pipelab.schedules import build
from pipelab.schedules.actions import Schedule
from pipelab.schedules.segments import aligned_sizes, boundaries
from pipelab.ties import stage_ties
from pipelab.tracing import resolve as resolve_tracing


@dataclass
class Job:
    """A fully checked training job: callables, plan, the schedule to execute, layouts, knobs."""

    model_fn: Callable[[], torch.nn.Module]
    data: Callable[[], Iterable[Any]]
    loss_fn: Callable[[Any, Any], torch.Tensor]
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
    plan: Plan
    schedule: Schedule
    ranges: tuple[tuple[int, int], ...]          # layer range of every (virtual) schedule stage
    specs: list[list[TensorSpec]]                # layout of the cut after each stage but the last
    steps: int
    microbatches: int
    batch_size: int
    seed: int = 0
    backend: str = "gloo"
    timeout: float = 300.0
    options: dict[str, Any] = field(default_factory=dict)        # the schedule's and the method's options
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)   # how the runtime executes it
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    trace_kwargs: dict[str, Any] = field(default_factory=dict)   # leaf_modules / depth for fx tracing
    state_keys: tuple[str, ...] = ()             # model_fn().state_dict() keys, in order
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])   # names this run's checkpoints
    #: per schedule worker, the process ranks of its tensor-parallel group (itself first; others after
    #: every worker's rank); empty when no stage is split (pipelab.runtime.tensor_group)
    groups: tuple[tuple[int, ...], ...] = ()
    ties: tuple[TieGroup, ...] = ()              # parameters shared across stages (pipelab.runtime.ties)

    @property
    def method(self) -> str:
        """The schedule's method name."""
        return self.schedule.method

    @property
    def policy_options(self) -> dict[str, Any]:
        """What a weight-policy factory receives: the method's options, the schedule, M."""
        return {**self.options, **self.runtime.method, "schedule": self.schedule,
                "microbatches": self.microbatches}

    def syncs(self, stage: int) -> bool:
        """Whether the replicas of ``stage`` all-reduce at ``U`` (not for HetPipe's virtual workers)."""
        replicated = len(self.schedule.stage_ranks[stage]) > 1
        return replicated and bool(self.schedule.options.get("allreduce", True))

    @property
    def world_size(self) -> int:
        """Number of processes: one per schedule worker, ``t`` per worker of a tensor degree ``t``."""
        return sum(len(g) for g in self.groups) if self.groups else self.schedule.num_workers

    def member(self, rank: int) -> tuple[int, int]:
        """``(schedule worker, index in its tensor group)`` of process ``rank``."""
        for w, g in enumerate(self.groups):
            if rank in g:
                return w, g.index(rank)
        return rank, 0


#: modules a job file may name factories from without ``trust`` (besides its own folder and the project)
ALLOWED_PREFIXES = ("torch.optim", "torch.nn", "torchvision.models", "pipelab.models", "pipelab.data")
#: never a factory, trusted or not: they run commands, touch files or load code
REFUSED_MODULES = frozenset({
    "builtins", "os", "posix", "nt", "subprocess", "_posixsubprocess", "sys", "shutil", "importlib", "runpy",
    "pickle", "marshal", "shelve", "ctypes", "socket", "signal", "pty", "code", "codeop", "pydoc", "io",
    "_io", "pathlib", "tempfile", "glob", "multiprocessing", "threading", "asyncio", "webbrowser", "urllib",
    "http", "ftplib", "smtplib", "zipfile", "tarfile", "sqlite3", "torch.hub", "torch.serialization",
    "torch.utils.cpp_extension", "torch.jit", "torch.package", "functools", "operator", "types", "inspect"})
#: job-file keys (top level or in ``options``) that are paths: relative to the job, inside its folder
PATH_KEYS = ("out", "checkpoint_dir", "resume")


def _refused(module: str) -> bool:
    parts = module.split(".")
    return any(".".join(parts[:i]) in REFUSED_MODULES for i in range(1, len(parts) + 1))


def resolve(spec: Any, *, trust: bool = True,
            roots: Sequence[str | os.PathLike[str]] = ()) -> Callable[..., Any]:
    """A callable from ``"module:function"`` or ``{"fn": "module:function", "kwargs": {...}}``.

    Untrusted, the module must live under one of ``roots`` or :data:`ALLOWED_PREFIXES`;
    :data:`REFUSED_MODULES` are refused always, also where the name is only re-exported.
    """
    if callable(spec):
        return spec
    kwargs: dict[str, Any] = dict(spec.get("kwargs", {})) if isinstance(spec, dict) else {}
    spec = spec.get("fn") if isinstance(spec, dict) else spec
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"{spec!r} is not a callable reference; write 'package.module:function'")
    mod, _, name = spec.partition(":")
    if not name.isidentifier() or name.startswith("_"):
        raise ValueError(f"{spec!r}: name a public top-level function or class of the module (no dots, no "
                         "leading underscore)")
    if _refused(mod):
        raise ValueError(f"{spec!r}: module {mod!r} is never a factory of a job (it can run commands or "
                         "touch files); name a model, data, loss or optimizer function")
    if not trust and not any(mod == p or mod.startswith(p + ".") for p in ALLOWED_PREFIXES):
        top = mod.split(".")[0]
        try:
            found = importlib.util.find_spec(top)     # locates the package without running it
        except (ImportError, ValueError):
            found = None
        where = None if found is None else (found.origin if found.origin not in (None, "namespace") else
                                            next(iter(found.submodule_search_locations or []), None))
        at = Path(where).resolve() if where else None
        if at is None or not any(at == r or r in at.parents for r in (Path(q).resolve() for q in roots)):
            raise ValueError(f"{spec!r}: module {mod!r} ({where or 'not found'}) is outside the job file's "
                             f"folder and the current project and not one of {', '.join(ALLOWED_PREFIXES)}; "
                             "a job file is data: pass --trust (trust=True) to let it name any importable "
                             "function")
    try:
        fn = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {spec!r} ({exc}); check the module is on PYTHONPATH") from None
    owner = getattr(fn, "__module__", None) if inspect.isroutine(fn) or inspect.isclass(fn) else None
    if isinstance(owner, str) and _refused(owner):
        raise ValueError(f"{spec!r} is {owner}.{getattr(fn, '__qualname__', name)}, which is never a factory "
                         "of a job")
    if not callable(fn):
        raise ValueError(f"{spec!r} is a {type(fn).__name__}, not a function or class")
    return functools.partial(fn, **kwargs) if kwargs else fn


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (for tools; a job's launcher binds its own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def stage_ranges(plan: Plan, schedule: Schedule) -> tuple[tuple[int, int], ...]:
    """Layer range of every schedule stage (a one-stage schedule, ``dp``, runs the whole model)."""
    if schedule.num_stages == 1:     # dp: the whole model on every worker, whatever the plan's cuts
        return ((0, plan.num_layers),)
    if schedule.num_stages != plan.num_stages:
        raise ValueError(f"the schedule has {schedule.num_stages} stages but the plan has {plan.num_stages}; "
                         "build the schedule from this plan")
    return tuple((s.start, s.end) for s in plan.stages)


def as_inputs(x: Any) -> tuple[torch.Tensor, ...]:
    """A minibatch's inputs as a tuple of tensors (one per model input)."""
    t = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    if not all(isinstance(v, torch.Tensor) for v in t):
        raise TypeError("data() must yield (inputs, targets) with inputs a tensor or a tuple of tensors; "
                        f"got inputs of type {type(x).__name__}")
    return t


def split_microbatches(x: Any, microbatches: int) -> list[Any]:
    """Split a tensor (or a tuple/list of tensors) along dim 0 into ``microbatches`` equal parts."""
    if isinstance(x, torch.Tensor):
        check_divides(int(x.shape[0]), microbatches)
        return list(x.split(x.shape[0] // microbatches))
    if isinstance(x, (tuple, list)):
        parts = [split_microbatches(v, microbatches) for v in x]
        return [tuple(p[j] for p in parts) for j in range(microbatches)]
    raise TypeError(f"cannot split a {type(x).__name__} into microbatches; use tensors or tuples of tensors")


def _shapes(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), str(x.dtype))
    return tuple(_shapes(v) for v in x) if isinstance(x, (tuple, list)) else type(x).__name__


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def first_minibatch(data: Callable[[], Iterable[Any]]) -> tuple[Any, Any]:
    """The first ``(inputs, targets)`` of ``data()``, checked for form."""
    try:
        mb = next(iter(data()))
    except StopIteration:
        raise ValueError("data() yielded no minibatch; it must yield (inputs, targets) pairs") from None
    if not (isinstance(mb, (tuple, list)) and len(mb) == 2):
        raise ValueError(f"data() must yield (inputs, targets) pairs; the first item is {_shapes(mb)}")
    return mb[0], mb[1]


def prepare(args: TrainArgs, *, check_rendezvous: bool = True) -> Job:
    """Check the arguments of ``train``/``launch`` and build the :class:`Job` (``check_rendezvous``
    False: under torchrun, which started the processes and owns the rendezvous)."""
    args.check()
    # trace as the plan's profile was traced (leaf_modules/depth recorded in plan.tracing)
    args = dataclasses.replace(args, trace_kwargs=resolve_tracing(**args.trace_kwargs,
                                                                  recorded=args.plan.tracing))
    the_method = args.method or (args.schedule.method if args.schedule is not None else None)
    method_options, rt_options = split_options(the_method, args.options)
    runtime = RuntimeOptions.from_options(the_method, rt_options)
    if runtime.resume:    # the one step folder every worker loads, its files' hashes checked here
        runtime = dataclasses.replace(runtime, resume=str(choose_resume(runtime.resume,
                                                                        fallback=runtime.resume_fallback)))
    schedule, steps, start = resolve_schedule(args, method_options, runtime)
    if start:
        runtime = dataclasses.replace(runtime, resume_step=start)
    microbatches = schedule.microbatches
    if runtime.coalesce_wgrad:
        check_method(schedule.method, any(a.kind == "W" for acts in schedule.actions for a in acts))
    options = {**schedule.options, **method_options}
    policy_for(schedule.method, {**options, **runtime.method, "schedule": schedule,
                                 "microbatches": microbatches})  # fails early
    gm, state_keys, n_inputs = model_facts(args)
    ranges = stage_ranges(args.plan, schedule)
    ties = tie_groups(stage_ties(gm, ranges), schedule)   # on the stage modules the workers build
    check_tie_method([g.tie for g in ties], schedule)
    check_schedule(ties, schedule)
    batch, specs = cut_layouts(gm, args, microbatches=microbatches, ranges=ranges, n_inputs=n_inputs)
    if args.backend != "local" and check_rendezvous and args.port is not None:
        check_port(args.port)      # its form; the launcher binds it (pipelab.runtime.lifeline.Rendezvous)
    groups = layout(args.plan, schedule)
    if groups:
        check_tensor_job(args, schedule, runtime)
        check_ties(ties, args.plan)
    if check_rendezvous and args.backend != "local":
        check_processes(sum(len(g) for g in groups) if groups else schedule.num_workers,
                        per_core=args.max_per_core, backend=args.backend, device=runtime.device)
    return Job(model_fn=args.model_fn, data=args.data, loss_fn=args.loss_fn, optimizer=args.optimizer,
               plan=args.plan, schedule=schedule, ranges=ranges, specs=specs, steps=steps,
               microbatches=microbatches, batch_size=batch, seed=args.seed, backend=args.backend,
               timeout=float(args.timeout), options=options, runtime=runtime, master_addr=args.master_addr,
               master_port=int(args.port or 0), trace_kwargs=dict(args.trace_kwargs), state_keys=state_keys,
               groups=groups, ties=ties)


def check_tensor_job(args: TrainArgs, schedule: Schedule, runtime: RuntimeOptions) -> None:
    """Refuse what a tensor degree > 1 does not run with, and a degree the model cannot split by."""
    if args.backend == "local":
        raise ValueError("backend='local' runs every worker in this process; a plan with a tensor degree > 1 "
                         "needs a process per shard: use backend='gloo'")
    spec = methods.METHODS.get(schedule.method)
    if spec is not None and spec.weights == "wsp":
        raise ValueError(f"method {schedule.method!r} keeps its weights on a parameter server, which holds "
                         "whole stages; tensor degrees > 1 run with the other methods")
    if runtime.shared_memory:
        raise ValueError("shared_memory=True: a tensor group's leader sends through gloo; leave it out")
    if runtime.compression is not None or runtime.coalesce_wgrad:
        raise ValueError("compression= and coalesce_wgrad= are not supported with tensor degrees > 1 yet; "
                         "leave them out")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        check_model(args.model_fn(), args.plan)


def resolve_schedule(args: TrainArgs, method_options: dict[str, Any],
                     runtime: RuntimeOptions) -> tuple[Schedule, int, int]:
    """The schedule to run, the minibatches it covers and its first step (a resumed run keeps its drains)."""
    plan, method, schedule, steps = args.plan, args.method, args.schedule, args.steps
    the_method = method or (schedule.method if schedule is not None else "")
    spec = methods.METHODS.get(the_method)
    D = int(method_options.get("D", schedule.options.get("D", 0) if schedule is not None else 0))
    if spec is not None and spec.weights == "wsp" and D and (runtime.resume or runtime.checkpoint_every):
        # with D > 0 a virtual worker may pull and start the next segment before the others push
        # their last wave, so no moment has every worker and the parameter server at one cut
        raise ValueError(f"checkpoints of hetpipe runs need the staleness bound D=0 (got D={D}): with D > 0 "
                         "the virtual workers are not synchronized at a segment's end, so there is no "
                         "consistent state of the parameter server to save; use D=0 or drop "
                         "checkpoint_every=/resume=")
    is_async = spec is not None and not spec.synchronous
    start = 0
    drain_every = runtime.checkpoint_every
    if runtime.resume:
        manifest = check_compatible(runtime.resume, plan=plan, method=the_method)
        start = int(manifest["step"])
        if start >= steps:
            raise ValueError(f"the checkpoint at {runtime.resume} is at step {start}, not before "
                             f"steps={steps}; pass a larger steps= to train further")
        steps -= start
        if drain_every is None:
            drain_every = manifest.get("extra", {}).get("drain_every")
    if schedule is None:
        if method is None:
            raise ValueError("pass method=... (e.g. '1f1b-flush') or a prebuilt schedule=")
        own_drain = "drain_every" in method_options or "segments" in method_options
        if is_async and drain_every and not own_drain:
            method_options = {**method_options, "segments": aligned_sizes(start, steps, int(drain_every))}
        schedule = build(method, plan, microbatches=args.microbatches, minibatches=steps, **method_options)
    elif method is not None and method != schedule.method:
        raise ValueError(f"method={method!r} but the schedule given is for {schedule.method!r}; "
                         "pass one of them")
    if schedule.minibatches != steps:
        raise ValueError(f"the schedule covers {schedule.minibatches} minibatches but steps={steps}"
                         + (f" (the steps left after resuming at step {start})" if start else ""))
    every = runtime.checkpoint_every
    if is_async and every:
        ends = set(boundaries(schedule)) if schedule.options.get("segments") else set()
        missing = [k for k in range(1, steps + 1) if (start + k) % every == 0 and k not in ends]
        if missing:
            raise ValueError(f"checkpoint_every={every}: the {schedule.method} schedule is not drained "
                             f"after minibatch(es) {[start + k for k in missing[:5]]}, so a checkpoint "
                             "there would not be a consistent cut; build it with pl.schedules.build(..., "
                             f"drain_every={every}) or leave schedule= out")
    return schedule, steps, start


def model_facts(args: TrainArgs) -> tuple[Any, tuple[str, ...], int]:
    """The traced model (built with the workers' seed), its state keys and input count, checked."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        model = args.model_fn()
    state_keys = tuple(model.state_dict())
    gm = trace(model, **args.trace_kwargs)
    n_layers = len(layer_nodes(gm))
    if args.plan.num_layers != n_layers:
        raise ValueError(f"plan is for a model of {args.plan.num_layers} layers but this model has "
                         f"{n_layers}; partition this model's profile")
    return gm, state_keys, sum(1 for n in gm.graph.nodes if n.op == "placeholder")


def cut_layouts(gm: Any, args: TrainArgs, *, microbatches: int, ranges: Sequence[tuple[int, int]],
                n_inputs: int) -> tuple[int, list[list[TensorSpec]]]:
    """The batch size and each cut's layout from ``data()``'s first minibatch, checked against the model."""
    data, loss_fn = args.data, args.loss_fn
    inputs, targets = first_minibatch(data)
    xs = as_inputs(inputs)
    if len(xs) != n_inputs:
        raise ValueError(f"the model takes {n_inputs} input(s) but data() yields {len(xs)}; yield (inputs, "
                         "targets) with inputs a tensor or a tuple of one tensor per model input")
    batch = int(xs[0].shape[0]) if xs[0].dim() else 0
    if batch < 1 or any(x.dim() == 0 or x.shape[0] != batch for x in xs):
        raise ValueError(f"the inputs' first dimension must be the batch; got shapes {_shapes(xs)}")
    check_divides(batch, microbatches)
    mb_x = tuple(split_microbatches(x, microbatches)[0] for x in xs)
    mb_y = split_microbatches(targets, microbatches)[0]
    fails = (f"the model or loss_fn fails on the first microbatch of data() (inputs {_shapes(mb_x)}, "
             f"targets {_shapes(mb_y)})")
    try:
        specs = boundary_specs(gm, mb_x, ranges)
        with torch.no_grad():
            loss = loss_fn(rebuild_output(gm.meta.get("output_type"), gm(*mb_x)), mb_y)
    except (TypeError, ValueError) as exc:
        if "crosses the cut" in str(exc):
            raise
        raise ValueError(f"{fails}: {type(exc).__name__}: {exc}; check that data() yields what the model "
                         "and loss_fn accept") from None
    except RuntimeError as exc:
        raise ValueError(f"{fails}: {exc}; check that data() yields what the model and loss_fn "
                         "accept") from None
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
        raise ValueError(f"loss_fn must return a scalar tensor (mean over the batch); got {_shapes(loss)}")
    if not _same((inputs, targets), first_minibatch(data)):
        raise ValueError("data() is not deterministic: two calls yield different first minibatches. Every "
                         "worker calls data() and takes its own microbatches, so it must yield the same "
                         "sequence each time (seed any shuffling)")
    return batch, specs


#: the keys a job file must hold (its others: :data:`JOB_FIELDS` and ``out``, with the record's defaults)
JOB_KEYS = ("model_fn", "data", "loss_fn", "optimizer", "plan", "method", "steps")
#: job-file keys that name callables
_CALLABLE_KEYS = ("model_fn", "data", "loss_fn", "optimizer")


def _job_path(p: Path, key: str, value: Any, trust: bool) -> Path:
    """Path ``value`` of job file ``p``'s ``key``, relative to its folder and, untrusted, inside it."""
    here = p.resolve().parent
    q = Path(str(value))
    q = (q if q.is_absolute() else here / q).resolve()
    if not trust and q != here and here not in q.parents:
        raise ValueError(f"job file {p}: {key}={str(value)!r} is outside the job's folder {here}; a job "
                         "file is data: pass --trust (trust=True) to let it write elsewhere")
    return q


def load_job_file(path: str | os.PathLike[str], *,
                  trust: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read a ``job.json`` (docs/job_format.md): returns (arguments for :func:`prepare`, extra settings).

    Untrusted, its callables must come from its folder, the working directory or
    :data:`ALLOWED_PREFIXES`, and its paths must stay inside its folder.
    """
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read job file {p}: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"job file {p} must hold a JSON object; see docs/job_format.md")
    valid = (*JOB_FIELDS, "out")
    unknown = sorted(set(doc) - set(valid))
    if unknown:
        raise ValueError(f"job file {p}: unknown key(s) {', '.join(map(repr, unknown))}; a job's keys are "
                         f"{', '.join(valid)} (the method's and the runtime's options go in \"options\"; "
                         "see docs/job_format.md)")
    missing = [k for k in JOB_KEYS if k not in doc]
    if missing:
        raise ValueError(f"job file {p} lacks {missing}; see docs/job_format.md for the keys")
    roots = (p.resolve().parent, Path.cwd().resolve())
    args: dict[str, Any] = {k: v for k, v in doc.items() if k in JOB_FIELDS and k != "options"}
    args.update({k: resolve(doc[k], trust=trust, roots=roots) for k in _CALLABLE_KEYS})
    plan_spec = doc["plan"]
    args["plan"] = (Plan.load(p.parent / plan_spec) if isinstance(plan_spec, str)
                    else Plan.from_dict(plan_spec))
    if not isinstance(doc.get("options") or {}, dict):
        raise ValueError(f"job file {p}: \"options\" must be an object of keyword options")
    options = dict(doc.get("options") or {})
    for k in PATH_KEYS:
        if options.get(k) is not None:
            options[k] = str(_job_path(p, f"options.{k}", options[k], trust))
    clash = sorted(set(options) & set(JOB_FIELDS))
    if clash:
        raise ValueError(f"job file {p}: {', '.join(map(repr, clash))} in \"options\" are the job's own "
                         "keys; write them at the top level")
    args.update(options)     # TrainArgs.of: keywords naming no field are the options
    if args.get("timeout") is not None:
        args["timeout"] = float(args["timeout"])
    out = _job_path(p, "out", doc["out"], trust) if "out" in doc else p.resolve().parent / (p.stem + ".out")
    return args, {"out": out}
