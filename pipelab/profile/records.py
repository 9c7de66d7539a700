"""The Profile record: a model as an ordered list of layers with their costs.

Layers are in a topological order of the model's graph; ``cut_bytes[i]`` counts every tensor alive
across the boundary after layer ``i`` (skip connections included): what a cut there sends forward.
Times are seconds per minibatch of ``batch_size`` samples, sizes bytes. A time for ``b`` samples is
affine in ``b``, ``fixed + (t - fixed) * b / batch_size``, where ``fwd_fixed_s``/``bwd_fixed_s`` (zero
unless measured with ``small_batch``) does not shrink with the batch.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from pipelab._display import html_pre
from pipelab._io import read_record, write_record
from pipelab.profile.pipedream_graph import read_fields
from pipelab.tensor_split import LayerSplit
from pipelab.ties import Tie
from pipelab.tracing import TracingConfig

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Layer:
    """One layer (a leaf of the model's graph) and what it costs for one minibatch."""

    name: str
    kind: str
    fwd_s: float
    bwd_s: float
    out_bytes: int
    param_bytes: int
    flops: int = 0
    #: bytes autograd saves for backward, each value once, at the layer that produces it
    saved_bytes: int = 0
    #: seconds of ``fwd_s``/``bwd_s`` that a smaller batch still pays in full
    fwd_fixed_s: float = 0.0
    bwd_fixed_s: float = 0.0
    #: whether ``saved_bytes`` counts this layer's output; None: not measured
    out_saved: bool | None = None
    #: seconds of ``bwd_s`` computing weight gradients; None: not measured (zero-bubble assumes half)
    wgrad_s: float | None = None
    #: parameter tensors (an optimizer step pays per tensor); None: not measured
    param_tensors: int | None = None

    def __post_init__(self) -> None:
        for attr in ("fwd_s", "bwd_s", "out_bytes", "param_bytes", "flops", "saved_bytes", "fwd_fixed_s",
                     "bwd_fixed_s"):
            v = getattr(self, attr)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"layer {self.name!r}: {attr}={v!r} must be a finite number >= 0; "
                                 f"fix the profile (times are seconds, sizes bytes)")
        for part, whole in (("fwd_fixed_s", "fwd_s"), ("bwd_fixed_s", "bwd_s")):
            if getattr(self, part) > getattr(self, whole) * (1 + 1e-9):
                raise ValueError(f"layer {self.name!r}: {part}={getattr(self, part)!r} exceeds {whole}="
                                 f"{getattr(self, whole)!r}; the fixed part of a time is at most the time")
        if self.param_tensors is not None and (isinstance(self.param_tensors, bool) or not isinstance(
                self.param_tensors, int) or self.param_tensors < 0):
            raise ValueError(f"layer {self.name!r}: param_tensors={self.param_tensors!r} must be an int >= 0 "
                             "or None")
        if self.wgrad_s is not None and not (
                isinstance(self.wgrad_s, (int, float)) and 0 <= self.wgrad_s <= self.bwd_s * (1 + 1e-9)):
            raise ValueError(f"layer {self.name!r}: wgrad_s={self.wgrad_s!r} must be a number in [0, bwd_s="
                             f"{self.bwd_s!r}] (the weight-gradient part of the backward) or None")


@dataclass(frozen=True)
class BlockedCut:
    """A boundary no stage cut may use: value ``value`` (a ``kind``, not a tensor) produced by layer
    ``producer`` (a model input: ``""``) crosses it to the layers ``users``; only tensors travel."""

    boundary: int   # the cut after layer ``boundary``
    value: str
    kind: str
    producer: str
    users: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "users", tuple(self.users))

    def reason(self) -> str:
        """Why the cut is illegal, with the layer names."""
        made = f"layer {self.producer!r}" if self.producer else "the model's input"
        used = ", ".join(repr(u) for u in self.users) or "the model's output"
        return f"value {self.value!r} ({self.kind}, not a tensor) made by {made} is used by {used}"


@dataclass(frozen=True)
class RangeTotals:
    """Totals of a contiguous layer range ``[start, end)`` of a profile (``profile[start:end]``)."""

    start: int
    end: int
    fwd_s: float
    bwd_s: float
    param_bytes: int
    flops: int
    saved_bytes: int
    in_bytes: int   # bytes entering the range: cut before it (the model input for start == 0)
    out_bytes: int  # bytes leaving the range: cut after it (the last layer's output at the end)

    @property
    def compute_s(self) -> float:
        """Forward plus backward seconds per minibatch."""
        return self.fwd_s + self.bwd_s


@dataclass(frozen=True)
class Profile:
    """Per-layer costs of a model, in topological order, plus what crosses every cut; ``edges``: the
    data-flow edges between layer indices, for drawing."""

    layers: tuple[Layer, ...]
    cut_bytes: tuple[int, ...]
    batch_size: int
    dtype: str = "float32"
    device: str = "cpu"
    input_bytes: int = 0
    model: str = ""
    source: str = ""
    edges: tuple[tuple[int, int], ...] = field(default=())
    #: bytes the loss saves for its backward, held by the last stage (0: not measured)
    loss_saved_bytes: int = 0
    #: boundaries a non-tensor value crosses: no stage may be cut there
    blocked_cuts: tuple[BlockedCut, ...] = ()
    #: how the model was traced into these layers; plans and runs trace it the same way
    tracing: TracingConfig = field(default_factory=TracingConfig)
    #: parameters that two or more layers use (tied weights), found by object identity (pipelab.ties)
    ties: tuple[Tie, ...] = field(default=())
    #: per layer, how it splits over a tensor-parallel group (pipelab.tensor_split); empty: the model
    #: declared no ``tensor_parallel_plan``
    tensor_splits: tuple[LayerSplit, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "tensor_splits", tuple(
            t if isinstance(t, LayerSplit) else LayerSplit.from_dict(t) for t in self.tensor_splits))
        if self.tensor_splits and len(self.tensor_splits) != len(self.layers):
            raise ValueError(f"tensor_splits has {len(self.tensor_splits)} entries for {len(self.layers)} "
                             "layers; give one per layer (pipelab.tensor_split.LayerSplit) or none")
        object.__setattr__(self, "ties", tuple(self.ties))
        object.__setattr__(self, "cut_bytes", tuple(int(c) for c in self.cut_bytes))
        object.__setattr__(self, "edges", tuple((int(a), int(b)) for a, b in self.edges))
        n = len(self.layers)
        if n == 0:
            raise ValueError("a Profile needs at least one layer")
        if len(self.cut_bytes) != n - 1:
            raise ValueError(f"cut_bytes has {len(self.cut_bytes)} entries but a profile of {n} layers has "
                             f"{n - 1} boundaries; give one per boundary between consecutive layers")
        if any(c < 0 for c in self.cut_bytes):
            raise ValueError("cut_bytes must be >= 0")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size!r} must be a positive integer")
        if self.input_bytes < 0:
            raise ValueError("input_bytes must be >= 0")
        lsb = self.loss_saved_bytes
        if isinstance(lsb, bool) or not isinstance(lsb, int) or lsb < 0:
            raise ValueError(f"loss_saved_bytes={lsb!r} must be an int >= 0 (bytes the loss saves for its "
                             "backward; 0 when not measured)")
        object.__setattr__(self, "blocked_cuts", tuple(
            c if isinstance(c, BlockedCut) else BlockedCut(**c) for c in self.blocked_cuts))
        for c in self.blocked_cuts:
            if not (0 <= c.boundary < n - 1):
                raise ValueError(f"blocked cut after layer {c.boundary} is outside the {n - 1} boundaries")
        if not isinstance(self.tracing, TracingConfig):
            object.__setattr__(self, "tracing", TracingConfig.from_dict(self.tracing))
        for a, b in self.edges:
            if not (0 <= a < b < n):
                raise ValueError(f"edge ({a}, {b}) is not forward between layer indices 0..{n - 1}")
        for t in self.ties:
            if t.layers[-1] >= n:
                raise ValueError(f"tie {t.name} names layer {t.layers[-1]} of a profile of {n} layers")

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def num_layers(self) -> int:
        """Number of layers."""
        return len(self.layers)

    @property
    def names(self) -> tuple[str, ...]:
        """Layer names in order."""
        return tuple(layer.name for layer in self.layers)

    @overload
    def __getitem__(self, key: int) -> Layer: ...
    @overload
    def __getitem__(self, key: slice) -> RangeTotals: ...

    def __getitem__(self, key: int | slice) -> Layer | RangeTotals:
        """``profile[i]`` is layer ``i``; ``profile[a:b]`` the totals of layers ``a..b-1``."""
        if isinstance(key, slice):
            start, end, step = key.indices(len(self))
            if step != 1:
                raise ValueError("a layer range must be contiguous (step 1)")
            return self.totals(start, end)
        return self.layers[key]

    def totals(self, start: int, end: int) -> RangeTotals:
        """Totals of the contiguous layer range ``[start, end)``."""
        n = len(self)
        if not (0 <= start < end <= n):
            raise ValueError(f"layer range [{start}, {end}) is empty or outside 0..{n}")
        sel = self.layers[start:end]
        sums = {k: sum(getattr(ly, k) for ly in sel) for k in ("fwd_s", "bwd_s", "param_bytes", "flops",
                                                               "saved_bytes")}
        return RangeTotals(start=start, end=end, **sums,
                           in_bytes=self.input_bytes if start == 0 else self.cut_bytes[start - 1],
                           out_bytes=self.layers[-1].out_bytes if end == n else self.cut_bytes[end - 1])

    @property
    def blocked_boundaries(self) -> frozenset[int]:
        """Layer indices ``i`` whose following cut (a stage starting at layer ``i + 1``) is illegal."""
        return frozenset(c.boundary for c in self.blocked_cuts)

    def legal_starts(self) -> list[bool]:
        """``legal[i]`` for ``i`` in ``0..n``: whether a stage may start (the previous one end) at layer
        ``i``; a non-tensor value crossing the cut before it makes it illegal."""
        blocked = self.blocked_boundaries
        return [i == 0 or i == len(self) or (i - 1) not in blocked for i in range(len(self) + 1)]

    def check_starts(self, starts: Sequence[int]) -> None:
        """Raise ``ValueError`` naming the value and layers when a stage starts at an illegal layer."""
        blocked = {c.boundary: c for c in self.blocked_cuts}
        bad = [int(s) for s in starts if 0 < int(s) < len(self) and int(s) - 1 in blocked]
        if bad:
            c = blocked[bad[0] - 1]
            legal = [i for i, ok in enumerate(self.legal_starts()) if ok and 0 < i < len(self)]
            raise ValueError(
                f"a stage cannot start at layer {bad[0]} ({self.layers[bad[0]].name!r}): the cut after layer "
                f"{c.boundary} ({self.layers[c.boundary].name!r}) would send {c.reason()}, and only tensors "
                f"travel between stages; start stages at legal layers ({_ranges(legal)}), or trace "
                "with leaf_modules/depth so that the value stays inside one layer")

    @property
    def fwd_s(self) -> float:
        """Whole-model forward seconds per minibatch."""
        return sum(layer.fwd_s for layer in self.layers)

    @property
    def bwd_s(self) -> float:
        """Whole-model backward seconds per minibatch."""
        return sum(layer.bwd_s for layer in self.layers)

    @property
    def param_bytes(self) -> int:
        """Whole-model parameter bytes."""
        return sum(layer.param_bytes for layer in self.layers)

    def fingerprint(self) -> str:
        """A short hash of the layer names and parameter bytes (not timings): a plan's model check."""
        text = "".join(f"{ly.name}|{ly.param_bytes};" for ly in self.layers)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def summary(self) -> pd.DataFrame:
        """One row per layer (times in ms, sizes in MB) as a pandas DataFrame, with a total row."""
        import pandas as pd

        cuts = [*self.cut_bytes, math.nan]
        df = pd.DataFrame([{
            "layer": ly.name, "kind": ly.kind, "fwd_ms": ly.fwd_s * 1e3, "bwd_ms": ly.bwd_s * 1e3,
            "out_MB": ly.out_bytes / 1e6, "cut_MB": cut / 1e6, "params_MB": ly.param_bytes / 1e6,
            "GFLOP": ly.flops / 1e9, "saved_MB": ly.saved_bytes / 1e6} for ly, cut in zip(self.layers, cuts)])
        total = {"layer": "TOTAL", "kind": "", **{c: df[c].sum() for c in
                 ("fwd_ms", "bwd_ms", "out_MB", "params_MB", "GFLOP", "saved_MB")}, "cut_MB": float("nan")}
        return pd.concat([df, pd.DataFrame([total])], ignore_index=True)

    def scaled(self, *, time: float = 1.0, batch_size: int | None = None) -> Profile:
        """A copy with all times multiplied by ``time`` (e.g. another device's relative speed)."""
        if not (time > 0 and math.isfinite(time)):
            raise ValueError("time scale must be a positive finite number")
        layers = tuple(replace(ly, fwd_s=ly.fwd_s * time, bwd_s=ly.bwd_s * time,
                               fwd_fixed_s=ly.fwd_fixed_s * time, bwd_fixed_s=ly.bwd_fixed_s * time,
                               wgrad_s=None if ly.wgrad_s is None else ly.wgrad_s * time)
                       for ly in self.layers)
        return replace(self, layers=layers, batch_size=batch_size or self.batch_size)

    def at_batch_size(self, batch_size: int) -> Profile:
        """This profile at minibatches of ``batch_size`` samples: times affine (module docstring), bytes
        of activations and cuts and flops linear, weights unchanged; ``source`` records it."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be a positive integer (samples per minibatch)")
        if batch_size == self.batch_size:
            return self
        r = batch_size / self.batch_size

        def t(total: float, fixed: float) -> float:
            return fixed + (total - fixed) * r

        layers = tuple(
            replace(ly, fwd_s=t(ly.fwd_s, ly.fwd_fixed_s), bwd_s=t(ly.bwd_s, ly.bwd_fixed_s),
                    # the weight-gradient part keeps its share of the backward
                    wgrad_s=None if ly.wgrad_s is None or not ly.bwd_s
                    else ly.wgrad_s * t(ly.bwd_s, ly.bwd_fixed_s) / ly.bwd_s,
                    out_bytes=int(round(ly.out_bytes * r)), saved_bytes=int(round(ly.saved_bytes * r)),
                    flops=int(round(ly.flops * r)))
            for ly in self.layers)
        note = (f"rescaled from batch {self.batch_size} to {batch_size} (times affine in the batch, "
                f"activations and cuts linear)")
        splits = tuple(replace(t, forward_allreduce_bytes=int(round(t.forward_allreduce_bytes * r)),
                               backward_allreduce_bytes=int(round(t.backward_allreduce_bytes * r)),
                               forward_allgather_bytes=int(round(t.forward_allgather_bytes * r)))
                       for t in self.tensor_splits)
        return replace(self, layers=layers, cut_bytes=tuple(int(round(c * r)) for c in self.cut_bytes),
                       batch_size=batch_size, tensor_splits=splits,
                       input_bytes=int(round(self.input_bytes * r)),
                       source=f"{self.source}; {note}" if self.source else note,
                       loss_saved_bytes=int(round(self.loss_saved_bytes * r)))

    @classmethod
    def synthetic(cls, fwd_s: Sequence[float], bwd_s: Sequence[float] | None = None,
                  out_bytes: Sequence[int] | None = None, param_bytes: Sequence[int] | None = None,
                  batch_size: int = 1, *, names: Sequence[str] | None = None, **fields: Any) -> Profile:
        """A profile from plain numbers, for tests and teaching.

        ``bwd_s`` defaults to twice ``fwd_s``; ``out_bytes`` and ``param_bytes`` to zero. ``fields``:
        other Profile fields (``cut_bytes``, default each cut's ``out_bytes``: a plain chain;
        ``input_bytes``; ``model``, default ``"synthetic"``).
        """
        n = len(fwd_s)
        if n == 0:
            raise ValueError("synthetic profile needs at least one layer (fwd_s is empty)")
        bwd = list(bwd_s) if bwd_s is not None else [2.0 * f for f in fwd_s]
        outs = list(out_bytes) if out_bytes is not None else [0] * n
        params = list(param_bytes) if param_bytes is not None else [0] * n
        nm = list(names) if names is not None else [f"layer{i}" for i in range(n)]
        for label, seq in (("bwd_s", bwd), ("out_bytes", outs), ("param_bytes", params), ("names", nm)):
            if len(seq) != n:
                raise ValueError(f"{label} has {len(seq)} entries but fwd_s has {n}; give one per layer")
        layers = tuple(Layer(name=nm[i], kind="synthetic", fwd_s=float(fwd_s[i]), bwd_s=float(bwd[i]),
                             out_bytes=int(outs[i]), param_bytes=int(params[i])) for i in range(n))
        return cls(**{"cut_bytes": [int(o) for o in outs[:-1]], "model": "synthetic", "source": "synthetic",
                      "edges": tuple((i, i + 1) for i in range(n - 1)), **fields},
                   layers=layers, batch_size=batch_size)

    @classmethod
    def from_pipedream(cls, path: str | os.PathLike[str], *, batch_size: int | None = None,
                       model: str | None = None) -> Profile:
        """Import one of PipeDream's ``graph.txt`` profiles (ms per minibatch, sizes in bytes)."""
        return cls.from_fields(read_fields(path, batch_size=batch_size, model=model))

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Profile:
        """A profile from its fields, ``layers`` given as each Layer's fields."""
        layers = tuple(Layer(**d) for d in fields["layers"])
        return cls(**{**fields, "layers": layers})

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (without the schema envelope)."""
        return {"model": self.model, "source": self.source, "batch_size": self.batch_size,
                "dtype": self.dtype, "device": self.device, "input_bytes": self.input_bytes,
                "layers": [asdict(layer) for layer in self.layers], "cut_bytes": list(self.cut_bytes),
                "edges": [list(e) for e in self.edges], "loss_saved_bytes": self.loss_saved_bytes,
                "blocked_cuts": [asdict(c) for c in self.blocked_cuts], "tracing": self.tracing.to_dict(),
                "ties": [t.to_dict() for t in self.ties],
                "tensor_splits": [t.to_dict() for t in self.tensor_splits]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` naming a missing or bad field."""
        try:
            layers = tuple(Layer(**layer) for layer in d["layers"])
            return cls(layers=layers, cut_bytes=tuple(d["cut_bytes"]), batch_size=int(d["batch_size"]),
                       dtype=d.get("dtype", "float32"), device=d.get("device", "cpu"),
                       input_bytes=int(d.get("input_bytes", 0)), model=d.get("model", ""),
                       source=d.get("source", ""), edges=tuple(tuple(e) for e in d.get("edges", ())),
                       loss_saved_bytes=int(d.get("loss_saved_bytes", 0)),
                       blocked_cuts=tuple(BlockedCut(**c) for c in d.get("blocked_cuts", ())),
                       tracing=TracingConfig.from_dict(d.get("tracing")),
                       ties=tuple(Tie.from_dict(t) for t in d.get("ties", ())),
                       tensor_splits=tuple(LayerSplit.from_dict(t) for t in d.get("tensor_splits", ())))
        except KeyError as exc:
            raise ValueError(f"profile JSON lacks field {exc}; re-create it with "
                             "pl.profile(...).save()") from None
        except TypeError as exc:
            raise ValueError(f"profile JSON has a malformed layer ({exc})") from None

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile as JSON (atomically) and return the path."""
        return write_record(path, "profile", SCHEMA_VERSION, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Profile:
        """Read a profile written by :meth:`save`."""
        return cls.from_dict(read_record(path, "profile", SCHEMA_VERSION))

    @classmethod
    def open(cls, spec: str | os.PathLike[str]) -> Profile:
        """A profile from a pipelab JSON file, a PipeDream ``graph.txt``, or a shipped name (``"vgg16"``)."""
        return cls.load(spec) if Path(spec).suffix == ".json" else cls.from_pipedream(spec)

    def _repr_html_(self) -> str:
        return html_pre(repr(self)) + self.summary().to_html(float_format=lambda v: f"{v:.3f}")

    def __repr__(self) -> str:
        return (f"Profile(model={self.model!r}, layers={len(self)}, batch={self.batch_size}, "
                f"fwd={self.fwd_s * 1e3:.2f} ms, bwd={self.bwd_s * 1e3:.2f} ms, "
                f"params={self.param_bytes / 1e6:.1f} MB, source={self.source!r})")


def _ranges(xs: Sequence[int]) -> str:
    """``[1, 2, 3, 7]`` as ``"1-3, 7"``."""
    parts: list[str] = []
    for x in xs:
        if parts and parts[-1].split("-")[-1] == str(x - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{x}"
        else:
            parts.append(str(x))
    return ", ".join(parts) or "none"
