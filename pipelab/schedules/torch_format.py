"""torch.distributed.pipelining's schedules as pipelab schedules, and back (the schedule IR only).

torch's schedules are data too: per rank, a list of ``_Action`` rows (``1F0``, ``0I1``/``0W1``,
``0B1``, ``(0F3;3B1)OVERLAP_F_B``, ``None``), computed for every rank in the constructor.
:func:`from_torch` maps them exactly (order and semantics) onto a :class:`Schedule` that pipelab
validates, simulates and draws; :func:`to_torch_order` and :func:`to_torch_csv` go back for
synchronous schedules. The mapping: docs/schedules.md; the private torch names: :mod:`.torch_api`.
"""

from __future__ import annotations

import csv
import inspect
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pipelab.methods as _methods
from pipelab._io import atomic_write_text
from pipelab.schedules import torch_api
from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.steps import ScheduleError
from pipelab.schedules.validate import validate as _validate

#: torch letter -> pipelab kind (``B`` is handled apart: it depends on whether the stage splits)
_KIND = {"F": "F", "I": "B", "W": "W"}


@dataclass
class _StandIn:
    """What a torch schedule constructor reads from its stages (``torch_api.STAGE_ATTRIBUTES``)."""

    stage_index: int
    num_stages: int
    group_size: int
    group_rank: int = 0
    submod: Any = None
    stage_index_to_group_rank: dict[int, int] = field(default_factory=dict)


def _no_loss(output: Any, target: Any) -> Any:
    """Placeholder loss: a schedule built only to read its order never runs it."""
    raise RuntimeError("this torch schedule was built by pipelab only to read its action order")


def torch_schedule_names() -> tuple[str, ...]:
    """The torch schedule classes :func:`from_torch` builds by name (``"ZBVZeroBubble"``, ...)."""
    return tuple(n.removeprefix("Schedule") for n in torch_api.SCHEDULE_CLASSES)


def _class_of(name: str) -> type:
    mod = torch_api.require()
    key = name.removeprefix("Schedule").lower()
    for n in torch_api.SCHEDULE_CLASSES:
        if n.removeprefix("Schedule").lower() == key:
            return getattr(mod, n)
    raise ScheduleError(f"{name!r} is not a torch schedule pipelab can build; use one of "
                        f"{', '.join(torch_schedule_names())}, a torch schedule object, or a compute-only "
                        "CSV file as torch's _dump_csv writes it")


def _order_of_class(cls: type, workers: int | None, microbatches: int | None,
                    stages_per_worker: int | None) -> dict[int, list[Any]]:
    mod = torch_api.require()
    if workers is None or microbatches is None:
        raise ScheduleError(f"from_torch({cls.__name__}) needs workers=P (pipeline ranks) and "
                            "microbatches=M (per step) to build torch's order")
    for what, v in (("workers", workers), ("microbatches", microbatches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ScheduleError(f"{what}={v!r} must be an int >= 1")
    single = issubclass(cls, mod.PipelineScheduleSingle)
    v = stages_per_worker if stages_per_worker is not None else (1 if single else 2)
    if single and v != 1:
        raise ScheduleError(f"torch's {cls.__name__} runs one stage per rank; drop stages_per_worker={v}")
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ScheduleError(f"stages_per_worker={v!r} must be an int >= 1")
    S = workers * v
    stages = [_StandIn(stage_index=c * workers, num_stages=S, group_size=workers) for c in range(v)]
    try:
        sched = cls(stages[0] if single else stages, microbatches, loss_fn=_no_loss)
    except (ValueError, RuntimeError, AssertionError) as exc:
        raise ScheduleError(f"torch's {cls.__name__} refuses {workers} ranks x {v} stages each with "
                            f"{microbatches} microbatches: {exc}") from None
    order = sched.pipeline_order
    if not order:
        raise ScheduleError(f"torch's {cls.__name__} exposes no action order (pipeline_order is empty)")
    return {int(r): list(acts) for r, acts in order.items()}


def _read_csv(path: Path) -> dict[int, list[Any]]:
    mod = torch_api.require()
    order: dict[int, list[Any]] = {}
    with open(path, newline="", encoding="utf-8") as fh:
        for rank, row in enumerate(csv.reader(fh)):
            try:
                order[rank] = [mod._Action.from_str(cell) for cell in row]
            except RuntimeError as exc:
                raise ScheduleError(f"{path}: row {rank + 1}: {exc}") from None
    if not order:
        raise ScheduleError(f"{path} holds no rows; torch's compute-only CSV has one row of actions per rank")
    return order


def _source_order(source: Any, workers: int | None, microbatches: int | None,
                  stages_per_worker: int | None) -> tuple[dict[int, list[Any]], int | None, str]:
    """(per-rank torch actions, M if the source knows it, a name for the schedule)."""
    if isinstance(source, os.PathLike) or (isinstance(source, str) and (
            source.endswith(".csv") or os.sep in source or Path(source).is_file())):
        path = Path(source)
        if not path.is_file():
            raise ScheduleError(f"{path} does not exist; pass a compute-only CSV written by torch's "
                                "_dump_csv(..., format='compute_only') or pipelab's to_torch_csv")
        return _read_csv(path), microbatches, f"torch:{path.stem}"
    mod = torch_api.require()
    if isinstance(source, str) or (inspect.isclass(source) and issubclass(source, mod._PipelineSchedule)):
        cls = _class_of(source) if isinstance(source, str) else source
        return (_order_of_class(cls, workers, microbatches, stages_per_worker), microbatches,
                "torch:" + cls.__name__.removeprefix("Schedule"))
    if isinstance(source, mod._PipelineSchedule):
        order = getattr(source, "pipeline_order", None)
        if not order:
            raise ScheduleError(f"this {type(source).__name__} exposes no action order (pipeline_order "
                                "is empty); build it by class name instead: from_torch(name, workers=, "
                                "microbatches=)")
        M = int(source._n_microbatches)
        if microbatches not in (None, M):
            raise ScheduleError(f"the schedule runs {M} microbatches per step, not "
                                f"microbatches={microbatches}")
        return ({int(r): list(a) for r, a in order.items()}, M,
                "torch:" + type(source).__name__.removeprefix("Schedule"))
    if isinstance(source, Mapping):
        parsed = {int(r): [mod._Action.from_str(a) if isinstance(a, str) else a for a in acts]
                  for r, acts in source.items()}
        return parsed, microbatches, "torch:custom"
    raise ScheduleError(f"from_torch takes a torch schedule class, object or name, a compute-only CSV path, "
                        f"or a dict rank -> actions; got {type(source).__name__}")


def _flatten(order: Mapping[int, Sequence[Any]]) -> dict[int, list[tuple[int, str, int]]]:
    """Per rank, the compute actions as (stage, torch letter, microbatch), overlaps unpacked."""
    out: dict[int, list[tuple[int, str, int]]] = {}
    for r in sorted(order):
        row: list[tuple[int, str, int]] = []
        pending = list(order[r])
        while pending:
            a = pending.pop(0)
            if a is None:
                continue
            letter = str(a.computation_type.value)
            if letter == "OVERLAP_F_B":
                pending[:0] = list(a.sub_actions or ())
                continue
            if letter not in ("F", "B", "I", "W"):
                continue          # sends, receives, FSDP unshard/reshard, gradient reductions
            if a.microbatch_index is None:
                raise ScheduleError(f"rank {r}: torch action {a} has no microbatch")
            row.append((int(a.stage_index), letter, int(a.microbatch_index)))
        out[r] = row
    return out


def _placement(stage_ranks: Sequence[int], P: int) -> str:
    S = len(stage_ranks)
    if all(r == s % P for s, r in enumerate(stage_ranks)):
        return "loop"
    if S == 2 * P and all(r == (s if s < P else 2 * P - 1 - s) for s, r in enumerate(stage_ranks)):
        return "v"
    return "custom"


def from_torch(source: Any, *, workers: int | None = None, microbatches: int | None = None,
               minibatches: int = 1, stages_per_worker: int | None = None, method: str | None = None,
               check: bool = True) -> Schedule:
    """A torch.distributed.pipelining schedule as a pipelab :class:`Schedule`.

    Args:
        source: a torch schedule class or its name (``"ZBVZeroBubble"``, ``"DualPipeV"``, ...; built
            for ``workers=P`` ranks, ``microbatches=M``, ``stages_per_worker``, default 2 for
            multi-stage classes), a torch schedule object, a compute-only CSV file (torch's
            ``_dump_csv``), or a dict rank -> actions (``_Action`` or strings like ``"0F1"``).
        minibatches: K repeats of torch's step.
        method: the schedule's name (default ``"torch:<class>"``).
        check: validate the result (:func:`pipelab.schedules.validate`).

    Example: ``pl.schedules.from_torch("ZBVZeroBubble", workers=4, microbatches=8)``.
    """
    if isinstance(minibatches, bool) or not isinstance(minibatches, int) or minibatches < 1:
        raise ScheduleError(f"minibatches={minibatches!r} must be an int >= 1")
    order, M, name = _source_order(source, workers, microbatches, stages_per_worker)
    rows = _flatten(order)
    P = len(rows)
    where = _placement_of(rows)
    S = max(where) + 1
    M = _checked_microbatches(rows, M, name)
    split = {s for row in rows.values() for s, letter, _ in row if letter in ("I", "W")}
    per_step: dict[int, list[tuple[int, str, int]]] = {}
    for r, row in rows.items():
        acts: list[tuple[int, str, int]] = []
        for s, letter, m in row:
            if letter == "B":
                acts += [(s, "B", m)] + ([(s, "W", m)] if s in split else [])
            else:
                acts.append((s, _KIND[letter], m))
        per_step[r] = acts
    actions: list[list[Action]] = []
    for r in range(P):
        hosted = sorted(s for s, rr in where.items() if rr == r)
        lst: list[Action] = []
        for k in range(minibatches):
            lst += [Action(s, kind, k * M + m) for s, kind, m in per_step[r]]
            lst += [Action(s, "U", k) for s in hosted]
        actions.append(lst)
    stage_ranks = [where[s] for s in range(S)]
    sch = Schedule(method=method or name, num_stages=S, stage_ranks=tuple((r,) for r in stage_ranks),
                   microbatches=M, minibatches=minibatches, actions=tuple(tuple(a) for a in actions),
                   options={"allreduce": False, "weights": "single", "split_backward": bool(split),
                            "placement": _placement(stage_ranks, P), "source": name,
                            "torch": torch_api.torch_version()})
    if check:
        _validate(sch, in_order=False)   # torch places its own sends (see validate)
    return sch


def _placement_of(rows: dict[int, list[tuple[int, str, int]]]) -> dict[int, int]:
    """Each stage's one rank, checked: every rank and every stage present, no stage on two ranks."""
    P = len(rows)
    if sorted(rows) != list(range(P)):
        raise ScheduleError(f"torch's order has ranks {sorted(rows)}; it needs every rank 0..{P - 1}")
    where: dict[int, int] = {}
    for r, row in rows.items():
        for s, _, _ in row:
            if where.setdefault(s, r) != r:
                raise ScheduleError(f"stage {s} runs on ranks {where[s]} and {r}; torch's pipelining and "
                                    "pipelab's imports place each stage on one rank")
    S = max(where, default=-1) + 1
    missing = [s for s in range(S) if s not in where]
    if not S or missing:
        raise ScheduleError(f"torch's order has no actions for stages {missing or [0]}; every stage "
                            f"0..{max(S - 1, 0)} needs its forwards and backwards")
    return where


def _checked_microbatches(rows: dict[int, list[tuple[int, str, int]]], M: int | None, name: str) -> int:
    """M as given (default: as many as the order names), each action's microbatch within it."""
    seen_mb = max((m for row in rows.values() for _, _, m in row), default=-1) + 1
    M = seen_mb if M is None else M
    if isinstance(M, bool) or not isinstance(M, int) or M < 1:
        raise ScheduleError(f"microbatches={M!r} must be an int >= 1")
    for r, row in rows.items():
        bad = [f"{s}{letter}{m}" for s, letter, m in row if m >= M]
        if bad:
            raise ScheduleError(f"{name}: rank {r}'s actions {bad[:4]} name microbatches beyond the "
                                f"{M} of a step (0..{M - 1}); torch's order for this schedule is wrong "
                                "(its step() may not follow it), so pipelab cannot import it")
    return M


def _refuse(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` saying why, if torch's engine cannot run ``schedule``."""
    spec = _methods.METHODS.get(schedule.method)
    if (spec is not None and not spec.synchronous) or schedule.versions is not None:
        raise ScheduleError(
            f"{schedule.method!r} is asynchronous: it updates weights without a flush and keeps several "
            "weight versions in flight, while torch.distributed.pipelining's step() runs one flushed "
            "minibatch with one weight version and leaves the optimizer step after it. torch's engine "
            f"cannot express it: run it with pipelab's runtime, pl.train(model_fn, plan, method="
            f"{schedule.method!r}, ...), or export a synchronous method (gpipe, 1f1b-flush, "
            "interleaved-1f1b, zb-h1, zb-h2, zb-v, dualpipev)")
    if spec is not None and spec.order == "dualpipe":
        raise ScheduleError(
            "dualpipe keeps two copies of every stage (stage s on workers s and P-1-s, one per direction) "
            "and sums their gradients; torch.distributed.pipelining places each stage on one rank and has "
            "no DualPipe, only DualPipeV: export method 'dualpipev' (the same F&B pairs on a V, one copy), "
            "or run dualpipe with pipelab's runtime (pl.train)")
    for s, ranks in enumerate(schedule.stage_ranks):
        if len(ranks) > 1:
            raise ScheduleError(
                f"stage {s} is replicated on workers {list(ranks)}: torch.distributed.pipelining places "
                "every stage on exactly one rank of its pipeline group, and data parallelism is another "
                "dimension of the device mesh in torch (wrap each stage in FSDP or DDP over a data-parallel "
                "group, pass the pipeline group as group=). Export a straight plan (replicas 1 per stage, "
                "e.g. pl.partition(..., straight=True)) and add data parallelism in torch, or run this "
                "plan with pipelab's runtime (pl.train)")


def to_torch_order(schedule: Schedule) -> dict[int, list[str]]:
    """One minibatch of a synchronous pipelab schedule in torch's IR: rank -> action strings (``B`` is
    ``I`` on a stage with ``W`` actions; ``U`` dropped). Every minibatch must share one order."""
    _refuse(schedule)
    M, K = schedule.microbatches, schedule.minibatches
    split = {a.stage for acts in schedule.actions for a in acts if a.kind == "W"}
    out: dict[int, list[str]] = {}
    for w, acts in enumerate(schedule.actions):
        steps: list[list[tuple[int, str, int]]] = [[] for _ in range(K)]
        for a in acts:
            if a.kind == "U":
                continue
            letter = "I" if a.kind == "B" and a.stage in split else a.kind
            steps[a.microbatch // M].append((a.stage, letter, a.microbatch % M))
        for k in range(1, K):
            if steps[k] != steps[0]:
                raise ScheduleError(f"worker {w} runs minibatch {k} in another order than minibatch 0; "
                                    "torch's step() repeats one order, so export a schedule whose "
                                    "minibatches share it (pipelab's builders do) or one minibatch of it")
        out[w] = [f"{s}{letter}{m}" for s, letter, m in steps[0]]
    return out


def to_torch_csv(schedule: Schedule, path: str | os.PathLike[str]) -> Path:
    """Write :func:`to_torch_order` as torch's compute-only CSV (``_PipelineScheduleRuntime._load_csv``)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(row for _, row in sorted(to_torch_order(schedule).items()))
    return atomic_write_text(path, buf.getvalue())
