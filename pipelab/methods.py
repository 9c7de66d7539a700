"""The method registry: every fact about a training method, in one frozen record per method.

Everything that differs between methods is a field of :class:`Method`; the layers above look a method
up here and dispatch on its fields, never on its name. Builders and weight policies are found by the
keys :attr:`Method.order` and :attr:`Method.weights` (a test checks each key has one implementation).
This module imports nothing of pipelab, so every layer can use it. Adding a method: ARCHITECTURE.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


class MethodError(ValueError):
    """An unknown method, or an option the method does not take; the message lists the valid ones."""


@dataclass(frozen=True)
class Option:
    """One keyword option of a method (or of every method).

    ``kind`` is a key of ``_KIND_WORDS``; ``maximum`` is exclusive. ``where``: ``"schedule"`` options
    shape the schedule, ``"runtime"`` ones only how the runtime executes it.
    """

    name: str
    kind: str
    default: Any
    doc: str
    where: Literal["schedule", "runtime"] = "schedule"
    minimum: float | None = None
    maximum: float | None = None
    required: bool = False

    def check(self, value: Any, method: str | None = None) -> None:
        """Raise :class:`MethodError` saying what to pass when ``value`` is not a valid ``self.kind``."""
        if value is None and not self.required:
            return
        owner = f" of method {method!r}" if method else ""
        ok = {"int": isinstance(value, int) and not isinstance(value, bool), "bool": isinstance(value, bool),
              "float": isinstance(value, (int, float)) and not isinstance(value, bool),
              "mapping": isinstance(value, Mapping), "str": isinstance(value, str),
              "path": isinstance(value, (str, bytes)) or hasattr(value, "__fspath__"),
              "list": isinstance(value, (list, tuple)), "any": True}[self.kind]
        if not (ok and (self.minimum is None or value >= self.minimum)
                and (self.maximum is None or value < self.maximum)):
            bound = (f" >= {self.minimum:g}" if self.minimum is not None else "") + \
                (f" and < {self.maximum:g}" if self.maximum is not None else "")
            raise MethodError(f"{self.name}={value!r}{owner} must be {_KIND_WORDS[self.kind]}{bound} "
                              f"({self.doc})")


_KIND_WORDS = {"int": "an int", "bool": "True or False", "float": "a number", "mapping": "a dict",
               "str": "a string", "path": "a path", "list": "a list", "any": "a value"}


@dataclass(frozen=True, kw_only=True)
class Method:
    """Everything pipelab knows about one method.

    - ``synchronous``: flushes every minibatch, so the result equals plain minibatch SGD.
    - ``update``: ``"minibatch"`` (one ``U`` per stage per minibatch of ``M`` microbatches) or
      ``"microbatch"`` (by default ``M = 1``, a ``U`` after each backward; the ``async-1f1b`` order's
      methods, PipeDream, naive-async and PipeMare, also run ``M = N`` microbatches per minibatch with
      one ``U`` per minibatch).
    - ``order``, ``weights``: keys of the schedule builder and of the runtime's weight policy.
    - ``versions``: the rule of :func:`pipelab.schedules.versions.assign_versions`.
    - ``replicas_allreduce``: replicas all-reduce at ``U``; ``coalesce_wgrad``: that option is allowed.
    - ``partitioner``: the partitioner the CLI uses for it when none is named.
    - ``baseline``: the planner's default (one method); ``heterogeneous``: searched on mixed devices only.
    - ``stages_per_worker``: plan stages per worker, an int (ZB-V: 2) or the option giving it
      (``"chunks"``); with ``v > 1`` a plan of ``P`` stages is re-split into ``v * P`` (ARCHITECTURE.md).
    """

    name: str
    synchronous: bool
    update: Literal["minibatch", "microbatch"]
    order: str
    versions: str
    weights: str
    description: str
    source: str
    options: tuple[Option, ...] = ()
    runtime_options: tuple[Option, ...] = ()
    replicas_allreduce: bool = True
    coalesce_wgrad: bool = False
    partitioner: str = "pipedream"
    baseline: bool = False
    heterogeneous: bool = False
    stages_per_worker: int | str = 1

    @property
    def option_names(self) -> tuple[str, ...]:
        """Every keyword this method takes: its own, then the ones every method takes."""
        return tuple(o.name for o in (*self.options, *COMMON_SCHEDULE_OPTIONS, *self.runtime_options,
                                      *COMMON_RUNTIME_OPTIONS))

    def option(self, name: str) -> Option:
        """The :class:`Option` called ``name`` (raises :class:`MethodError` listing the valid ones)."""
        for o in (*self.options, *COMMON_SCHEDULE_OPTIONS, *self.runtime_options, *COMMON_RUNTIME_OPTIONS):
            if o.name == name:
                return o
        raise MethodError(f"method {self.name!r} takes no option {name!r}; its options: "
                          f"{', '.join(self.option_names)}")

    def defaults(self, where: Literal["schedule", "runtime"] = "schedule") -> dict[str, Any]:
        """The method's own options of ``where`` with their defaults (required ones left out): what
        builders and weight policies see under the user's options."""
        own = self.options if where == "schedule" else self.runtime_options
        return {o.name: o.default for o in own if not o.required}

    def virtual_stages(self, options: Mapping[str, Any]) -> int:
        """Stages per worker ``v`` under ``options`` (1 when the option naming it is not given)."""
        v = self.stages_per_worker
        if isinstance(v, str):
            v = options.get(v) or 1
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise MethodError(f"{self.stages_per_worker}={v!r} of method {self.name!r} must be an int >= 1 "
                              "(stages per worker)")
        return v


def split_options(method: str | Method | None, options: Mapping[str, Any]
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(schedule_options, runtime_options)`` of ``options``: the one place that tells them apart.

    Runtime options are every method's (:data:`COMMON_RUNTIME_OPTIONS`) and ``method``'s own; another
    method's runtime option raises :class:`MethodError` naming its owner, and so does an option
    ``method`` does not take (listing its options). Values are checked where they are used:
    ``schedules.build`` (schedule options), ``RuntimeOptions.from_options`` (runtime ones).
    """
    spec = get(method) if method is not None else None
    mine = {o.name for o in (*COMMON_RUNTIME_OPTIONS, *(spec.runtime_options if spec else ()))}
    sched: dict[str, Any] = {}
    rt: dict[str, Any] = {}
    for k, v in options.items():
        if k in mine:
            rt[k] = v
            continue
        owners = [m.name for m in METHODS.values() if any(o.name == k for o in m.runtime_options)]
        if owners:
            raise MethodError(f"option {k}= belongs to method {' or '.join(repr(o) for o in owners)} "
                              f"(got method={spec.name if spec else None!r})")
        if spec is not None:
            spec.option(k)     # an option the method does not take: the registry's message
        sched[k] = v
    return sched, rt


#: options of every method's schedule (asynchronous methods drain; synchronous ones ignore them)
COMMON_SCHEDULE_OPTIONS: tuple[Option, ...] = (
    Option("drain_every", "int", None, "drain the pipeline every N minibatches (exact checkpoints)",
           minimum=1),
    Option("segments", "list", None, "lengths of the drained segments, summing to minibatches"),
)

#: options the runtime executes for every method (never seen by the schedule builders)
COMMON_RUNTIME_OPTIONS: tuple[Option, ...] = (
    Option("compression", "str", None, "codec for activations and gradients between stages: fp16, bf16, int8",
           where="runtime"),
    Option("recompute", "bool", False, "recompute activations in backward (GPipe's re-materialization)",
           where="runtime"),
    Option("slowdown", "mapping", None, "{worker: factor >= 1}: emulate slower devices", where="runtime"),
    Option("coalesce_wgrad", "bool", False, "one weight-gradient GEMM per Linear at the update",
           where="runtime"),
    Option("device", "str", None, "where stages compute: 'cpu' or 'cuda' (gloo stages CUDA messages through "
           "host memory, so workers may share a GPU)", where="runtime"),
    Option("measure_memory", "bool", False, "count each worker's memory after every action "
           "(RunResult.peak_memory)", where="runtime"),
    Option("pin_cores", "bool", None, "pin each CPU worker process to a core of its own (None: when the "
           "workers fit the host's cores)", where="runtime"),
    Option("shared_memory", "bool", None, "gloo: point-to-point messages through shared memory (None: where "
           "the stages compute on CPUs of one host with room for the rings; False: gloo's own path)",
           where="runtime"),
    Option("checkpoint_every", "int", None, "checkpoint every N minibatches", where="runtime", minimum=1),
    Option("checkpoint_dir", "path", None, "where checkpoints go", where="runtime"),
    Option("checkpoint_keep", "int", 2, "how many checkpoints to keep", where="runtime", minimum=1),
    Option("resume", "path", None, "resume from this checkpoint folder", where="runtime"),
    Option("resume_fallback", "bool", True, "a damaged newest checkpoint falls back to the previous sealed "
           "one, with a warning (False: refuse)", where="runtime"),
    Option("on_nonfinite", "str", "raise", "a NaN/inf loss or gradient: 'raise', 'warn' or 'skip' (the "
           "update)", where="runtime"),
)

_IN_FLIGHT = Option("extra_in_flight", "int", 0, "rounds of minibatches admitted beyond NOAM", minimum=0)

_PIPEMARE_RUNTIME = (
    Option("lr_reschedule", "bool", True, "PipeMare T1: learning-rate warm-up by delay", where="runtime"),
    Option("discrepancy_correction", "bool", True, "PipeMare T2: extrapolate backward weights",
           where="runtime"),
    Option("warmup_steps", "int", 100, "T1's K", where="runtime", minimum=0),
    Option("decay", "float", 0.5, "T2's gamma", where="runtime", minimum=0.0, maximum=1.0),
    Option("decay_from_delay", "bool", False, "gamma = decay ** (1 / tau)", where="runtime"),
)

_SOURCES = {
    "gpipe": "Huang et al., GPipe, NeurIPS'19",
    "pipedream": "Narayanan et al., PipeDream, SOSP'19",
    "flush": "Narayanan et al., PipeDream-2BW/Flush, ICML'21; Shoeybi et al., Megatron-LM",
    "megatron": "Narayanan et al., Megatron-LM interleaved schedule, SC'21",
    "zb": "Qi et al., Zero Bubble Pipeline Parallelism, ICLR'24",
    "dualpipe": "DeepSeek-AI, DeepSeek-V3 Technical Report (2024), section 3.2.1",
    "dualpipev": "Sea AI Lab, DualPipe could be better without the Dual (2025); DeepSeek-AI's DualPipeV",
    "pipemare": "Yang et al., PipeMare, MLSys'21",
    "lv": "Lv et al., bounded weight buffer, CCGrid'23",
    "hetpipe": "Park et al., HetPipe, USENIX ATC'20",
}

#: every method, by name (the order is the order menus and tables list them in)
METHODS: dict[str, Method] = {m.name: m for m in (
    Method(name="dp", synchronous=True, update="minibatch", order="dp", versions="single", weights="single",
           description="data parallel: one stage on every worker, all-reduce per minibatch",
           source="baseline", coalesce_wgrad=True, partitioner="dp"),
    Method(name="gpipe", synchronous=True, update="minibatch", order="gpipe", versions="single",
           weights="single", description="GPipe: fill-drain, flush per minibatch",
           source=_SOURCES["gpipe"], coalesce_wgrad=True, partitioner="gpipe"),
    Method(name="1f1b-flush", synchronous=True, update="minibatch", order="1f1b-flush", versions="single",
           weights="single", description="1F1B with a flush per minibatch (PipeDream-Flush, Megatron)",
           source=_SOURCES["flush"], coalesce_wgrad=True, baseline=True),
    Method(name="interleaved-1f1b", synchronous=True, update="minibatch", order="interleaved",
           versions="single", weights="single",
           description="interleaved 1F1B (Megatron-LM), option chunks=v; any microbatches >= P",
           source=_SOURCES["megatron"], coalesce_wgrad=True, stages_per_worker="chunks",
           options=(Option("chunks", "int", None, "virtual stages per worker", minimum=1, required=True),)),
    Method(name="zb-h1", synchronous=True, update="minibatch", order="zb-h1", versions="single",
           weights="single", source=_SOURCES["zb"],
           description="zero-bubble ZB-H1: backward split into B (input grad) and W (weight grad)"),
    Method(name="zb-h2", synchronous=True, update="minibatch", order="zb-h2", versions="single",
           weights="single", source=_SOURCES["zb"],
           description="zero-bubble ZB-H2: split backward, 2P-1 microbatches in flight, no bubble once "
                       "M >= 2P"),
    Method(name="zb-v", synchronous=True, update="minibatch", order="zb-v", versions="single",
           weights="single", source=_SOURCES["zb"], stages_per_worker=2,
           description="zero-bubble ZB-V: two stages per worker in a V, split backward"),
    Method(name="dualpipe", synchronous=True, update="minibatch", order="dualpipe", versions="single",
           weights="single", source=_SOURCES["dualpipe"], partitioner="gpipe",
           description="DualPipe: microbatches from both ends, worker s holds stages s and P-1-s "
                       "(two copies of the weights)"),
    Method(name="dualpipev", synchronous=True, update="minibatch", order="dualpipev", versions="single",
           weights="single", source=_SOURCES["dualpipev"], stages_per_worker=2,
           description="DualPipeV: DualPipe cut in half, two stages per worker in a V, F&B pairs"),
    Method(name="pipedream", synchronous=False, update="microbatch", order="async-1f1b", versions="stash",
           weights="stash", source=_SOURCES["pipedream"],
           description="PipeDream: 1F1B, NOAM in flight, no flush, weight stashing; option vertical_sync",
           options=(Option("vertical_sync", "bool", False, "every stage reads the input stage's version"),
                    _IN_FLIGHT)),
    Method(name="naive-async", synchronous=False, update="microbatch", order="async-1f1b",
           versions="latest", weights="latest",
           description="1F1B without flush and without stashing (PipeDream §3 ablation)",
           source=_SOURCES["pipedream"], options=(_IN_FLIGHT,)),
    Method(name="pipemare", synchronous=False, update="microbatch", order="async-1f1b", versions="latest",
           weights="pipemare",
           description="PipeMare: no stash; LR rescheduling and discrepancy correction in the runtime",
           source=_SOURCES["pipemare"], options=(_IN_FLIGHT,), runtime_options=_PIPEMARE_RUNTIME),
    Method(name="2bw", synchronous=False, update="minibatch", order="coalesced", versions="delay",
           weights="delay", source=_SOURCES["flush"],
           description="PipeDream-2BW: two weight versions, gradient coalescing over M microbatches",
           options=(Option("versions", "int", 2, "weight versions kept: 2BW keeps two (buffered keeps more)",
                           minimum=2, maximum=3),)),
    Method(name="buffered", synchronous=False, update="minibatch", order="coalesced", versions="delay",
           weights="delay", source=_SOURCES["lv"], partitioner="prefix-sum",
           description="bounded weight buffer of K versions (Lv et al.), option versions=K",
           options=(Option("versions", "int", 2, "weight versions kept (K >= 2; K = 2 is 2BW)", minimum=2),)),
    Method(name="hetpipe", synchronous=False, update="microbatch", order="hetpipe", versions="stash",
           weights="wsp", source=_SOURCES["hetpipe"],
           description="HetPipe: PipeDream inside virtual workers, WSP across them; option D",
           options=(Option("D", "int", 0, "WSP staleness bound in waves", minimum=0),),
           replicas_allreduce=False, partitioner="hetpipe", heterogeneous=True),
)}


def get(method: str | Method) -> Method:
    """The :class:`Method` called ``method`` (a :class:`Method` as is); :class:`MethodError` lists all."""
    if isinstance(method, Method):
        return method
    found = METHODS.get(method) if isinstance(method, str) else None
    if found is None:
        raise MethodError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    return found


def names(*, synchronous: bool | None = None) -> tuple[str, ...]:
    """Method names, all or only the (a)synchronous ones, in registry order."""
    return tuple(n for n, m in METHODS.items() if synchronous is None or m.synchronous == synchronous)


#: the planner's default method (:attr:`Method.baseline`)
BASELINE: str = next(n for n, m in METHODS.items() if m.baseline)
