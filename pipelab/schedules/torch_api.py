"""The private parts of ``torch.distributed.pipelining`` that pipelab's torch bridge relies on, pinned.

torch keeps its schedule IR private (``_Action``, ``_ComputationType``, ``pipeline_order``,
``_PipelineScheduleRuntime``); this module is the one place that names them. :data:`TESTED_TORCH` is
the release the bridge was checked against (``tests/test_torch_bridge.py`` fails when the installed
torch differs); :func:`problems` lists every name, field and signature that is missing or changed, and
:func:`require` raises :class:`TorchAPIError` with that list.
"""

from __future__ import annotations

import inspect
import warnings
from functools import lru_cache, reduce
from types import ModuleType

#: the torch release the bridge was written and tested against (the one the project installs)
TESTED_TORCH = "2.14.1"

#: the computation types of torch's schedule IR the bridge reads or writes, with their letters
COMPUTE_TYPES = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W",
                 "OVERLAP_F_B": "OVERLAP_F_B"}
#: the communication and FSDP types a compute+comms order may also hold (the importer drops them)
COMM_TYPES = ("SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD")
#: the schedule classes the importer knows by name, and what each constructor takes first
SCHEDULE_CLASSES = ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleLoopedBFS",
                    "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV")

#: (object path inside torch.distributed.pipelining.schedules, parameter names it must take, in order)
_SIGNATURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("PipelineScheduleMulti.__init__", ("self", "stages", "n_microbatches", "loss_fn")),
    ("PipelineScheduleSingle.__init__", ("self", "stage", "n_microbatches", "loss_fn")),
    ("_PipelineScheduleRuntime._prepare_schedule_with_comms", ("self", "actions", "format")),
    ("_PipelineScheduleRuntime._load_csv", ("self", "filename", "format")),
    ("_PipelineScheduleRuntime._dump_csv", ("self", "filename", "format")),
    ("PipelineScheduleSingle._get_pipeline_order", ("self",)),
    ("_validate_schedule", ("actions", "pp_group_size", "num_stages", "num_microbatches")),
    ("get_schedule_class", ("schedule_name",)),
)
#: what each schedule class's constructor reads from the stages it is given (the importer passes
#: stand-ins with exactly these attributes, as torch's own tests do with their mock stages)
STAGE_ATTRIBUTES = ("stage_index", "num_stages", "group_size", "group_rank", "submod",
                    "stage_index_to_group_rank")


class TorchAPIError(RuntimeError):
    """The installed torch lacks (or changed) a private name the torch bridge relies on."""


def torch_version() -> str:
    """The installed torch release without a local build tag (``"2.14.1"`` for ``2.14.1+cpu``)."""
    import torch

    return str(torch.__version__).split("+")[0]


def _schedules() -> ModuleType:
    from torch.distributed.pipelining import schedules

    return schedules


def problems() -> list[str]:
    """Every private name, field, enum value or signature of torch's pipelining the bridge uses that
    the installed torch lacks or changed (empty when all is as in :data:`TESTED_TORCH`)."""
    try:
        mod = _schedules()
    except ImportError as exc:
        return [f"torch.distributed.pipelining.schedules cannot be imported ({exc})"]
    out: list[str] = []
    action = getattr(mod, "_Action", None)
    if action is None:
        out.append("schedules._Action is missing")
    else:
        fields = tuple(getattr(action, "_fields", ()))
        want = ("stage_index", "computation_type", "microbatch_index", "sub_actions")
        if fields[:4] != want:
            out.append(f"schedules._Action has fields {fields}, expected {want}")
        if not callable(getattr(action, "from_str", None)):
            out.append("schedules._Action.from_str is missing")
    ctype = getattr(mod, "_ComputationType", None)
    if ctype is None:
        out.append("schedules._ComputationType is missing")
    else:
        for name, letter in [*COMPUTE_TYPES.items(), *((c, c) for c in COMM_TYPES)]:
            member = getattr(ctype, name, None)
            if member is None or member.value != letter:
                out.append(f"schedules._ComputationType.{name} is missing or is not {letter!r}")
    for path, params in _SIGNATURES:
        try:
            obj = reduce(getattr, path.split("."), mod)
        except AttributeError:
            out.append(f"schedules.{path} is missing")
            continue
        got = tuple(inspect.signature(obj).parameters)   # type: ignore[arg-type]
        if got[: len(params)] != params:
            out.append(f"schedules.{path} takes {got}, expected it to start with {params}")
    bases = ("_PipelineSchedule", "PipelineScheduleSingle", "PipelineScheduleMulti",
             "_PipelineScheduleRuntime")
    return out + [f"schedules.{name} is missing" for name in (*bases, *SCHEDULE_CLASSES)
                  if not inspect.isclass(getattr(mod, name, None))]


@lru_cache(maxsize=1)
def _checked() -> tuple[str, ...]:
    return tuple(problems())


def require() -> ModuleType:
    """Return ``torch.distributed.pipelining.schedules`` once everything the bridge uses is there.

    Raises :class:`TorchAPIError` listing what changed; warns (once) when the installed torch is not
    :data:`TESTED_TORCH` but has everything.
    """
    bad = _checked()
    if bad:
        raise TorchAPIError(
            f"pipelab's torch bridge was written against torch {TESTED_TORCH}'s private pipelining API "
            f"and torch {torch_version()} is installed, which changed it: " + "; ".join(bad)
            + f". Install torch=={TESTED_TORCH} (as the project's Makefile does) or use pipelab's own "
            "runtime (pl.train)")
    if torch_version() != TESTED_TORCH:
        warnings.warn(f"pipelab's torch bridge was tested with torch {TESTED_TORCH}; torch "
                      f"{torch_version()} has every private name it uses, but was not tested",
                      RuntimeWarning, stacklevel=2)
    return _schedules()
