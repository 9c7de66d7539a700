"""Runtime options of every pipelined method: compression, recomputation, slowdowns, checkpoints, ...

``pl.train(..., compression="int8", recompute=True, slowdown={1: 2.0}, checkpoint_every=5,
checkpoint_dir="ckpt", resume="ckpt")`` - these knobs change how the runtime executes a schedule,
never the schedule itself, so :func:`split_options` takes them (and PipeMare's hyperparameters)
out of the keyword arguments before ``pl.schedules.build`` sees the rest.

* ``compression``: ``"fp16"``, ``"bf16"`` or ``"int8"`` (:mod:`pipelab.runtime.compress`) for the
  activations and gradients that cross stage boundaries; the trace's send events count the bytes
  actually sent.
* ``recompute=True``: a stage's forward keeps only its inputs and recomputes its activations in the
  backward pass (``torch.utils.checkpoint``, non-reentrant; GPipe's re-materialization).
* ``slowdown={worker: factor}``: after each compute action the worker sleeps ``(factor - 1)`` times
  the action's duration, emulating a device ``factor`` times slower (heterogeneous clusters on one
  machine).
* ``device="cuda"``: every worker's stages compute on a CUDA device (worker ``r`` on GPU
  ``r % device_count``, so several workers may share one GPU); with ``backend="gloo"`` messages and
  all-reduces go through host memory (:mod:`pipelab.runtime.comm`). ``backend="nccl"`` always computes
  on CUDA, one GPU per worker.
* ``coalesce_wgrad=True``: every ``nn.Linear`` defers its weight and bias gradients to the update,
  where one GEMM over the minibatch's stacked microbatches (``G^T X``) replaces one per microbatch
  (:mod:`pipelab.runtime.coalesce`; faster at small microbatches). Off by default: each Linear's
  input and output gradient of every microbatch is held until the flush. Flushed methods only
  (``gpipe``, ``1f1b-flush``, ``interleaved-1f1b``, ``dp``); others are refused.
* ``measure_memory=True``: each worker counts the memory it holds after every action
  (:mod:`pipelab.runtime.memory`: weights and stashed versions, gradients, optimizer state, what
  autograd saves for in-flight microbatches, message buffers; on a CUDA worker process
  ``torch.cuda.max_memory_allocated``); ``RunResult.peak_memory`` is the peak per worker.
* ``pin_cores``: pin each CPU worker process to a core of its own (:mod:`pipelab.runtime.affinity`);
  ``None`` (default) when this host's workers fit its cores, ``True`` always, ``False`` never.
* ``shared_memory=True``: with gloo and every worker on one host, move point-to-point messages through
  shared memory (:mod:`pipelab.runtime.shm`) instead of gloo's point-to-point path (the default).
* ``checkpoint_every=N, checkpoint_dir=path``: after every ``N``-th minibatch each worker saves its
  stages (weights, optimizer, weight versions, RNG) and one coordinator seals the manifest
  (:mod:`pipelab.runtime.checkpoint_files`; ``checkpoint_keep=2`` newest are kept); ``resume=path``
  continues a run from the newest complete checkpoint under ``path`` (or a given ``step-*`` folder)
  up to ``steps`` minibatches in all (``RunResult.losses`` then covers the resumed steps only).
  Every method resumes to exactly the weights of an uninterrupted run: asynchronous methods are
  then scheduled as drained segments of ``N`` minibatches (:mod:`pipelab.schedules.segments`;
  one pipeline fill and drain per ``N`` minibatches), so each checkpoint is a cut with nothing in
  flight, and a resumed run keeps the manifest's ``N``. HetPipe checkpoints need ``D=0``: the cut
  is right after a wave's pull, where every virtual worker holds the parameter server's weights.
  The step to resume from is chosen once, in ``prepare``, after checking its files' hashes; a
  damaged newest checkpoint falls back to the previous sealed one with a warning
  (``resume_fallback=False`` refuses instead). A run holds a lock on its checkpoint folder.
* ``on_nonfinite``: what a NaN or inf loss or gradient does: ``"raise"`` (default), ``"warn"``,
  ``"skip"`` the update (:mod:`pipelab.runtime.guards`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

import pipelab.methods as methods
from pipelab.runtime.compress import check_codec
from pipelab.runtime.guards import ON_NONFINITE


def runtime_option_names(method: str | None) -> frozenset[str]:
    """Options the runtime consumes for ``method`` (never passed to the schedule builders): every
    method's (:data:`pipelab.methods.COMMON_RUNTIME_OPTIONS`) and the method's own."""
    spec = methods.METHODS.get(method) if method else None
    own = spec.runtime_options if spec is not None else ()
    return frozenset(o.name for o in (*methods.COMMON_RUNTIME_OPTIONS, *own))


def split_options(method: str | None, options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(schedule_options, runtime_options)``: what goes to ``pl.schedules.build`` and what stays here.

    Checks the runtime options' values and raises ``ValueError`` saying what to pass instead; a
    runtime option of another method raises naming that method. Anything else is a schedule option
    (``schedules.build`` checks it against the registry).
    """
    mine = runtime_option_names(method)
    sched: dict[str, Any] = {}
    rt: dict[str, Any] = {}
    for k, v in options.items():
        if k in mine:
            rt[k] = v
            continue
        owners = [m.name for m in methods.METHODS.values() if any(o.name == k for o in m.runtime_options)]
        if owners:
            raise ValueError(f"option {k}= belongs to method {' or '.join(repr(o) for o in owners)} "
                             f"(got method={method!r})")
        sched[k] = v
    check_runtime_options(rt)
    return sched, rt


def check_runtime_options(rt: Mapping[str, Any]) -> None:
    """Raise a clear ``ValueError`` for a bad runtime option value."""
    if rt.get("compression") is not None:
        check_codec(rt["compression"])
    sd = rt.get("slowdown")
    if sd is not None:
        if not isinstance(sd, Mapping):
            raise ValueError(f"slowdown={sd!r} must be a dict {{worker rank: factor >= 1}}, e.g. {{1: 2.0}}")
        for w, f in sd.items():
            if not isinstance(w, int) or w < 0 or not isinstance(f, (int, float)) or not f >= 1.0:
                raise ValueError(f"slowdown entry {w!r}: {f!r} must map a worker rank to a factor >= 1 "
                                 "(2.0 = twice as slow)")
    dev = rt.get("device")
    if dev is not None:
        if not isinstance(dev, str) or not (dev in ("cpu", "cuda") or dev.startswith("cuda:")):
            raise ValueError(f"device={dev!r} must be 'cpu' or 'cuda' (or 'cuda:N'): where stages compute")
        if dev.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device={dev!r} needs a CUDA GPU but torch.cuda.is_available() is False "
                             "on this machine; leave device= out to compute on the CPU")
    mode = rt.get("on_nonfinite")
    if mode is not None and mode not in ON_NONFINITE:
        raise ValueError(f"on_nonfinite={mode!r}; use one of {ON_NONFINITE} (what a NaN or inf loss or "
                         "gradient does)")
    for k in ("coalesce_wgrad", "measure_memory", "pin_cores", "resume_fallback", "shared_memory"):
        if rt.get(k) is not None and not isinstance(rt[k], bool):
            raise ValueError(f"{k}={rt[k]!r} must be True or False")
    n = rt.get("checkpoint_every")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"checkpoint_every={n!r} must be an int >= 1 (minibatches between checkpoints)")
        if not rt.get("checkpoint_dir"):
            raise ValueError("checkpoint_every=N needs checkpoint_dir=... (where to write the checkpoints)")
    if rt.get("checkpoint_dir") and n is None:
        raise ValueError("checkpoint_dir=... needs checkpoint_every=N (minibatches between checkpoints)")
    for k in ("warmup_steps",):
        if k in rt and (not isinstance(rt[k], int) or rt[k] < 0):
            raise ValueError(f"{k}={rt[k]!r} must be an int >= 0")
    if "decay" in rt and not (isinstance(rt["decay"], (int, float)) and 0.0 <= rt["decay"] < 1.0):
        raise ValueError(f"decay={rt['decay']!r} must be in [0, 1)")


@dataclass(frozen=True)
class RuntimeOptions:
    """How the runtime executes a schedule (never what the schedule is): one checked, frozen record.

    Every field is a keyword of ``pl.train`` (see the module docstring); ``method`` holds the
    method's own runtime options (PipeMare's ``lr_reschedule``, ``warmup_steps``, ...), and
    ``resume_step`` is the step a resumed run starts from (set by the runtime, not the user).
    Build it with :meth:`from_options`, which checks every value and says what to pass instead.
    """

    compression: str | None = None
    recompute: bool = False
    slowdown: Mapping[int, float] = field(default_factory=dict)
    coalesce_wgrad: bool = False
    checkpoint_every: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_keep: int = 2
    resume: str | None = None
    resume_step: int = 0
    device: str | None = None     # where stages compute under gloo: None/"cpu", "cuda", "cuda:N"
    measure_memory: bool = False  # count each worker's memory after every action (runtime/memory.py)
    pin_cores: bool | None = None  # one core per CPU worker process (runtime/affinity.py)
    shared_memory: bool | None = None  # p2p through shared memory on one host (runtime/shm.py)
    on_nonfinite: str = "raise"    # a NaN/inf loss or gradient: "raise", "warn", "skip" (runtime/guards.py)
    resume_fallback: bool = True   # a damaged newest checkpoint: fall back to the previous sealed one
    method: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_options(cls, method: str | None, options: Mapping[str, Any]) -> RuntimeOptions:
        """The record of ``options`` (runtime options only, as :func:`split_options` returns them)."""
        check_runtime_options(options)
        common = {o.name for o in methods.COMMON_RUNTIME_OPTIONS}
        own = {k: v for k, v in options.items() if k not in common}
        unknown = sorted(set(own) - runtime_option_names(method))
        if unknown:
            raise ValueError(f"{', '.join(unknown)} are not runtime options of method {method!r}; its "
                             f"runtime options: {', '.join(sorted(runtime_option_names(method)))}")
        codec = options.get("compression")
        ckdir, resume = options.get("checkpoint_dir"), options.get("resume")
        return cls(
            compression=None if codec in (None, "none") else str(codec),
            recompute=bool(options.get("recompute") or False),
            slowdown={int(w): float(f) for w, f in (options.get("slowdown") or {}).items()},
            coalesce_wgrad=bool(options.get("coalesce_wgrad") or False),
            checkpoint_every=None if options.get("checkpoint_every") is None
            else int(options["checkpoint_every"]),
            checkpoint_dir=None if ckdir is None else str(ckdir),
            checkpoint_keep=int(options.get("checkpoint_keep") or 2),
            resume=None if resume is None else str(resume),
            device=None if options.get("device") is None else str(options["device"]),
            measure_memory=bool(options.get("measure_memory") or False),
            pin_cores=None if options.get("pin_cores") is None else bool(options["pin_cores"]),
            shared_memory=None if options.get("shared_memory") is None else bool(options["shared_memory"]),
            on_nonfinite=str(options.get("on_nonfinite") or "raise"),
            resume_fallback=bool(options.get("resume_fallback", True)),
            method=dict(own),
        )


def slow_down(rank: int, slowdown: Mapping[int, float] | None, elapsed_s: float) -> None:
    """Sleep ``(factor - 1) * elapsed_s`` if worker ``rank`` has a slowdown factor."""
    if not slowdown:
        return
    f = float(slowdown.get(rank, 1.0))
    if f > 1.0 and elapsed_s > 0:
        time.sleep((f - 1.0) * elapsed_s)


def tune_malloc() -> bool:
    """Keep freed memory in this process (glibc): no page faults for the tensors every step reallocates.

    A training step frees and reallocates the same large buffers (weight gradients, GEMM outputs,
    copy-on-write weight versions). With glibc's defaults (dynamic mmap and trim thresholds that
    start at 128 KiB) such blocks go back to the kernel when freed, so each step page-faults them in
    again (``reproductions/benchmarks/README.md`` has the count). ``mallopt(M_MMAP_THRESHOLD, 32 MiB)``
    (glibc's maximum on 64-bit) and ``mallopt(M_TRIM_THRESHOLD, 1 GiB)`` keep them (as PyTorch's
    caching allocators do on GPUs);
    the cost is that the process does not shrink after a peak. Called in the runtime's worker
    processes only (never in the user's process). A no-op, returning False, where libc is not glibc
    or the user set ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` themselves.
    """
    import ctypes
    import os
    import sys

    if not sys.platform.startswith("linux") or any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_",
                                                                                "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3     # <malloc.h>
        ok = libc.mallopt(m_mmap_threshold, 32 << 20) == 1
        return bool(libc.mallopt(m_trim_threshold, 1 << 30) == 1 and ok)
    except (OSError, AttributeError):
        return False


def run_maybe_checkpointed(fn: Any, inputs: tuple[torch.Tensor, ...], recompute: bool) -> Any:
    """``fn(*inputs)``, or under ``torch.utils.checkpoint`` (activations recomputed in backward)."""
    if not recompute or not torch.is_grad_enabled():
        return fn(*inputs)
    from torch.utils.checkpoint import checkpoint

    return checkpoint(fn, *inputs, use_reentrant=False)
