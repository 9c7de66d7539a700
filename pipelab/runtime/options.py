"""Runtime options: how the runtime executes a schedule (compression, recompute, slowdowns, checkpoints...).

Invariant: these never change the schedule; :func:`pipelab.methods.split_options` (re-exported
here) takes them out of the keyword arguments before ``pl.schedules.build`` sees the rest, and
:class:`RuntimeOptions` is their one checked, frozen record. Each option is described in
docs/training_options.md.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import pipelab.methods as methods
from pipelab.methods import split_options as split_options
from pipelab.runtime.compress import check_codec
from pipelab.runtime.guards import ON_NONFINITE


def runtime_option_names(method: str | None) -> frozenset[str]:
    """Options the runtime consumes for ``method``: every method's and the method's own."""
    spec = methods.METHODS.get(method) if method else None
    own = spec.runtime_options if spec is not None else ()
    return frozenset(o.name for o in (*methods.COMMON_RUNTIME_OPTIONS, *own))


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
    for k, v in rt.items():   # booleans and counts: the kind and bounds the registry declares
        if k in _NUMERIC_OPTIONS:
            _NUMERIC_OPTIONS[k].check(v)
    if "decay" in rt and not (isinstance(rt["decay"], (int, float)) and 0.0 <= rt["decay"] < 1.0):
        raise ValueError(f"decay={rt['decay']!r} must be in [0, 1)")
    n = rt.get("checkpoint_every")
    if n is not None and not rt.get("checkpoint_dir"):
        raise ValueError("checkpoint_every=N needs checkpoint_dir=... (where to write the checkpoints)")
    if rt.get("checkpoint_dir") and n is None:
        raise ValueError("checkpoint_dir=... needs checkpoint_every=N (minibatches between checkpoints)")


#: runtime options (every method's and the methods' own) whose values the registry's Option.check checks
_NUMERIC_OPTIONS = {o.name: o for o in (*methods.COMMON_RUNTIME_OPTIONS,
                                        *(o for m in methods.METHODS.values() for o in m.runtime_options))
                    if o.kind in ("bool", "int")}


#: every method's runtime options as the registry declares them (name, kind, default, meaning, bounds)
_COMMON = {o.name: o for o in methods.COMMON_RUNTIME_OPTIONS}


def _default(name: str) -> Any:
    """The default of runtime option ``name``, declared once in ``methods.COMMON_RUNTIME_OPTIONS``."""
    return _COMMON[name].default


@dataclass(frozen=True)
class RuntimeOptions:
    """How the runtime executes a schedule: one checked, frozen record (:meth:`from_options`); ``method``
    holds the method's own runtime options (PipeMare's), ``resume_step`` is set by the runtime.

    Each field but those two is a ``methods.COMMON_RUNTIME_OPTIONS`` entry, its default and check
    taken from there (``tests/test_runtime_helpers.py`` checks the two lists agree)."""

    compression: str | None = _default("compression")
    recompute: bool = _default("recompute")
    slowdown: Mapping[int, float] = field(default_factory=dict)
    coalesce_wgrad: bool = _default("coalesce_wgrad")
    checkpoint_every: int | None = _default("checkpoint_every")
    checkpoint_dir: str | None = _default("checkpoint_dir")
    checkpoint_keep: int = _default("checkpoint_keep")
    resume: str | None = _default("resume")
    resume_step: int = 0
    device: str | None = _default("device")     # None/"cpu", "cuda", "cuda:N"
    measure_memory: bool = _default("measure_memory")   # runtime/memory.py
    pin_cores: bool | None = _default("pin_cores")      # runtime/affinity.py
    shared_memory: bool | None = _default("shared_memory")   # runtime/shm.py
    on_nonfinite: str = _default("on_nonfinite")   # runtime/guards.py
    resume_fallback: bool = _default("resume_fallback")
    method: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_options(cls, method: str | None, options: Mapping[str, Any]) -> RuntimeOptions:
        """The record of ``options`` (runtime options only, as ``split_options`` returns them)."""
        check_runtime_options(options)
        own = {k: v for k, v in options.items() if k not in _COMMON}
        unknown = sorted(set(own) - runtime_option_names(method))
        if unknown:
            raise ValueError(f"{', '.join(unknown)} are not runtime options of method {method!r}; its "
                             f"runtime options: {', '.join(sorted(runtime_option_names(method)))}")

        def get(name: str) -> Any:
            v = options.get(name)
            return _default(name) if v is None else v

        codec = get("compression")
        opt: dict[str, Any] = {name: None if get(name) is None else conv(get(name))
                               for name, conv in _CONVERT.items()}
        return cls(**opt, compression=None if codec in (None, "none") else str(codec),
                   slowdown={int(w): float(f) for w, f in (options.get("slowdown") or {}).items()},
                   method=dict(own))


#: how each plain runtime option's value becomes its field (None stays None)
_CONVERT: dict[str, Any] = {
    "recompute": bool, "coalesce_wgrad": bool, "checkpoint_every": int, "checkpoint_dir": str,
    "checkpoint_keep": int, "resume": str, "device": str, "measure_memory": bool, "pin_cores": bool,
    "shared_memory": bool, "on_nonfinite": str, "resume_fallback": bool}


def tune_malloc() -> bool:
    """Keep freed memory in this worker process (glibc), so buffers reallocated every step don't
    page-fault; False (a no-op) off glibc or where the user set ``MALLOC_*_THRESHOLD_``."""
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


def run_maybe_checkpointed(fn: Any, inputs: tuple[torch.Tensor, ...], recompute: bool,
                           buffers: Sequence[torch.Tensor] = ()) -> Any:
    """``fn(*inputs)``, or under ``torch.utils.checkpoint`` (activations recomputed in backward, the
    stage's ``buffers`` left as one forward leaves them: :mod:`pipelab.runtime.recompute`)."""
    if not recompute or not torch.is_grad_enabled():
        return fn(*inputs)
    from pipelab.runtime.recompute import checkpointed

    return checkpointed(fn, inputs, buffers)
