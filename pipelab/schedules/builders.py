"""Building a method's schedule: the registry's order names a builder, and ``build`` picks M and K.

``build(method, plan, microbatches=M, minibatches=K, **options) -> Schedule`` is a pure function of
the plan's topology (or an int ``P``: a straight ``P``-stage pipeline).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pipelab.methods as _methods
from pipelab.batching import default_microbatches
from pipelab.methods import MethodError
from pipelab.metrics import in_flight
from pipelab.partition.plan import Plan
from pipelab.schedules import async_, dualpipe, segments, sync, zero_bubble
from pipelab.schedules import hetpipe as _hetpipe
from pipelab.schedules.actions import Schedule
from pipelab.schedules.steps import ScheduleError, resolve_plan


class MethodScheduleError(ScheduleError, MethodError):
    """An unknown method or option met by :func:`build` (the registry's message; both error types)."""


def _coalesced(name: str, p: Plan, M: int, K: int, options: dict[str, Any]) -> Schedule:
    kv = options["versions"]
    if isinstance(kv, bool) or not isinstance(kv, int) or kv < 2:
        raise ScheduleError(f"buffered needs versions=K >= 2 (K=1 is a flush: use '1f1b-flush'); got {kv!r}")
    return async_.coalesced(p, name, M, K, delay=kv - 1)


Builder = Callable[[str, Plan, int, int, dict[str, Any]], Schedule]

#: the schedule builder of each :attr:`pipelab.methods.Method.order`: (method name, plan, M, K, options)
BUILDERS: dict[str, Builder] = {
    "dp": lambda name, p, M, K, o: sync.dp(p, M, K),
    "gpipe": lambda name, p, M, K, o: sync.gpipe(p, M, K),
    "1f1b-flush": lambda name, p, M, K, o: sync.one_f_one_b_flush(p, M, K),
    "interleaved": lambda name, p, M, K, o: sync.interleaved(p, M, K, int(o["chunks"])),
    "zb-h1": lambda name, p, M, K, o: sync.zb_h1(p, M, K),
    "zb-h2": lambda name, p, M, K, o: zero_bubble.zb_h2(p, M, K),
    "zb-v": lambda name, p, M, K, o: zero_bubble.zb_v(p, M, K),
    "dualpipe": lambda name, p, M, K, o: dualpipe.dualpipe(p, M, K),
    "dualpipev": lambda name, p, M, K, o: dualpipe.dualpipev(p, M, K),
    "async-1f1b": lambda name, p, M, K, o: async_.per_minibatch_async(
        p, name, K, vertical_sync=bool(o.get("vertical_sync", False)),   # only pipedream offers it
        extra_in_flight=int(o["extra_in_flight"]), microbatches=M),
    "coalesced": _coalesced,
    "hetpipe": lambda name, p, M, K, o: _hetpipe.hetpipe(p, K, D=int(o["D"])),
}


def build(method: str, plan: Plan | int, microbatches: int | None = None, minibatches: int | None = None,
          **options: Any) -> Schedule:
    """Build ``method``'s schedule for ``plan`` (a Plan, or an int P: straight P stages).

    Args:
        microbatches: M per minibatch (default: 1 for pipedream-like methods, the stage count for
            pipelined ones, the worker count for ``dp``).
        minibatches: K (default 1 for sync methods; for async ones enough for a steady state, a
            multiple of the replica counts).
        options: the method's (``pipelab.methods``; the builder sees its defaults under them), e.g.
            ``chunks`` (interleaved-1f1b; with an int P, ``chunks * P`` virtual stages: a method with
            ``stages_per_worker`` v > 1 reads an int P as P workers), and ``drain_every=N`` or
            ``segments=[n0, ...]``: an asynchronous schedule as drained segments (:mod:`.segments`)
            for exact checkpoints.
    """
    spec = _checked(method, options)
    given = dict(options)      # what the user passed: drained segments rebuild from it
    drain_every = given.pop("drain_every", None)
    seg_sizes = given.pop("segments", None)
    if drain_every is not None and seg_sizes is not None:
        raise ScheduleError("pass drain_every=N or segments=[n0, n1, ...], not both")
    for o in spec.options:
        if o.required and o.name not in given:
            raise ScheduleError(f"{spec.name} needs {o.name}= ({o.doc}), e.g. {o.name}=2")
    options = {**spec.defaults(), **given}    # the builders see the registry's defaults under the user's
    try:
        v = spec.virtual_stages(options)
    except MethodError as exc:
        raise ScheduleError(str(exc)) from None
    if v > 1 and isinstance(plan, int) and not isinstance(plan, bool) and plan >= 1:
        plan = plan * v                        # an int P is P workers: v * P stages
    p = resolve_plan(plan)
    M = _microbatches(spec, p, microbatches, options)
    # replicas pair their k-th updates: with an update per microbatch, K a multiple of every replica count
    per_microbatch = spec.update == "microbatch" and M == 1   # async 1F1B with N > 1: one U per minibatch
    step = math.lcm(*p.replicas) if per_microbatch and spec.replicas_allreduce else 1
    K = _minibatches(spec, p, M, minibatches, step, options)
    if (drain_every is not None or seg_sizes is not None) and not spec.synchronous:
        return _drained(method, p, M, K, drain_every, seg_sizes, step, given)
    return BUILDERS[spec.order](spec.name, p, M, K, options)


def _checked(method: str, options: dict[str, Any]) -> _methods.Method:
    """``method``'s registry entry, with each schedule option checked (runtime options refused)."""
    try:
        spec = _methods.get(method)
        for k, v in options.items():
            opt = spec.option(k)
            if opt.where != "schedule":
                raise MethodError(f"{k} is a runtime option of {method!r}: pass it to pl.train, not to "
                                  "schedules.build")
            if k not in ("chunks", "versions"):   # those two get the builders' own, more specific words
                opt.check(v, method)
    except MethodError as exc:
        raise MethodScheduleError(str(exc)) from None
    return spec


def _microbatches(spec: _methods.Method, p: Plan, microbatches: int | None, options: dict[str, Any]) -> int:
    """M: 1 for a method updating per microbatch, else as given, or the default for its order."""
    if spec.update == "microbatch":
        if microbatches not in (None, 1) and spec.order != "async-1f1b":
            raise ScheduleError(f"{spec.name} treats every microbatch as a minibatch (M = 1); pass "
                                f"minibatches=K instead of microbatches={microbatches}")
        if microbatches in (None, 1):
            return 1
    if microbatches is None:
        M = default_microbatches(p.num_stages // spec.virtual_stages(options), replicas=max(p.replicas),
                                 workers=p.num_workers, data_parallel=spec.order == "dp")
        if spec.order == "coalesced":
            M = max(M, in_flight(p.replicas, 0, per_replica=False))
    else:
        M = microbatches
    if isinstance(M, bool) or not isinstance(M, int) or M < 1:
        raise ScheduleError(f"microbatches={M!r} must be an int >= 1")
    return M


def _minibatches(spec: _methods.Method, p: Plan, M: int, minibatches: int | None, step: int,
                 options: dict[str, Any]) -> int:
    """K: as given, or 1 for a synchronous method and enough for a steady state for the others."""
    K = minibatches
    if K is None:
        admitted = in_flight(p.replicas, 0, per_replica=False) + int(options.get("extra_in_flight", 0)) * step
        g = max(1, -(-admitted // M))
        K = 1 if spec.synchronous else max(3 * g, 2 * g + 3 * step)
        K = -(-K // step) * step
    if isinstance(K, bool) or not isinstance(K, int) or K < 1:
        raise ScheduleError(f"minibatches={K!r} must be an int >= 1")
    if K % step:
        raise ScheduleError(f"{spec.name} on plan {p.config!r} all-reduces replicas' k-th updates, so every "
                            f"replica needs as many minibatches: use minibatches a multiple of {step} (got "
                            f"{K})")
    return K


def _drained(method: str, p: Plan, M: int, K: int, every: Any, sizes: Any, step: int,
             options: dict[str, Any]) -> Schedule:
    """``method``'s schedule as drained segments of ``every`` minibatches, or of the lengths ``sizes``."""
    if sizes is None:
        sizes = segments.split_sizes(K, every)
    elif not (isinstance(sizes, (list, tuple))
              and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes)
              and sum(sizes) == K):
        raise ScheduleError(f"segments={sizes!r} must be a list of ints >= 1 summing to minibatches={K}")
    unit = step
    what = "all-reduces replicas' k-th updates"
    if not _methods.get(method).replicas_allreduce:
        # HetPipe: every virtual worker must end each segment on a full wave (push and pull done)
        unit = p.replicas[0] * p.num_stages
        what = f"synchronizes its {p.replicas[0]} virtual workers every wave of {p.num_stages} minibatches"
    if any(n % unit for n in sizes):
        raise ScheduleError(f"{method} on plan {p.config!r} {what}, so every drained segment needs a "
                            f"multiple of {unit} minibatches: use drain_every and minibatches multiples of "
                            f"{unit} (got drain_every={every}, minibatches={K})")
    mb = None if _methods.get(method).update == "microbatch" and M == 1 else M
    built = {n: build(method, p, microbatches=mb, minibatches=n, **options) for n in dict.fromkeys(sizes)}
    return segments.concat([built[n] for n in sizes])    # each segment length built once

