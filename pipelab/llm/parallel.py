"""How a transformer job is split: tensor x pipeline x data degrees, microbatches, recompute, sharding.

Devices are numbered tensor-innermost (Megatron-LM's order): the ``tensor`` ranks of one stage replica
are consecutive, a data-parallel group strides by ``tensor``, and consecutive pipeline stages stride by
``tensor * data``. So a tensor group sits inside one node when ``tensor`` divides the GPUs per node,
on the fast links (:meth:`Parallel.check` refuses a wider one unless ``allow_slow_tensor``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipelab.cluster import Cluster
    from pipelab.llm.shape import Transformer

#: activation recomputation policies: Korthikanti et al. 2022's three, and torchtitan's per-operator
#: save list ("selective-op": :func:`pipelab.llm.memory.op_saved_bytes`; memory only)
RECOMPUTE = ("none", "selective", "full", "selective-op")
SHARDING = ("none", "zero1", "fsdp")
#: pipeline orders whose in-flight microbatches :mod:`pipelab.llm.memory` knows
SCHEDULES = ("1f1b", "interleaved", "zb-h1", "zb-h2", "gpipe")


class ParallelError(ValueError):
    """A parallel configuration that does not fit the model, the batch or the cluster."""


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _nearest(valid: list[int], want: int, k: int = 3) -> list[int]:
    return sorted(sorted(valid, key=lambda v: (abs(v - want), v))[:k])


def check_stage_layers(model: Transformer, parallel: Parallel, stage_layers: Sequence[int]) -> None:
    """Refuse uneven blocks per stage that are not one non-negative count per pipeline stage adding up to
    the model's layers."""
    counts = list(stage_layers)
    if len(counts) != parallel.pipeline or any(isinstance(c, bool) or not isinstance(c, int) or c < 0
                                               for c in counts):
        raise ParallelError(f"stage_layers={counts} must give one count >= 0 per pipeline stage "
                            f"({parallel.pipeline})")
    if sum(counts) != model.layers:
        raise ParallelError(f"stage_layers={counts} add up to {sum(counts)} but {model.name} has "
                            f"{model.layers} layers")


@dataclass(frozen=True)
class Parallel:
    """One job's parallel plan; every knob a keyword.

    Args:
        tensor, pipeline, data: degrees (devices = their product).
        microbatch_size: sequences per microbatch.
        microbatches: microbatches per pipeline per iteration (global batch: ``data * microbatches * b``).
        virtual: model chunks per device (interleaved 1F1B, Narayanan et al. SC'21 §2.2).
        recompute: one of :data:`RECOMPUTE` (``"selective"``: Korthikanti et al. 2022 §5's).
        sequence_parallel: norms and dropout split over the tensor group by sequence (Korthikanti §4.2.2).
        sharding: ``"none"``, ``"zero1"`` (optimizer states over the data group; Rajbhandari et al. SC'20)
            or ``"fsdp"`` (weights, gradients and states; ZeRO-3).
        dp_overlap: the gradient all-reduce runs in buckets behind the backward.
        tensor_overlap: backward collectives behind the weight GEMMs (:mod:`pipelab.llm.costs`).
        schedule: the pipeline order whose in-flight microbatches set the activation memory (SCHEDULES).
    """

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    microbatch_size: int = 1
    microbatches: int = 1
    virtual: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    sharding: str = "none"
    dp_overlap: bool = True
    schedule: str = "1f1b"
    tensor_overlap: bool = False

    def __post_init__(self) -> None:
        for label in ("tensor", "pipeline", "data", "microbatch_size", "microbatches", "virtual"):
            v = getattr(self, label)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ParallelError(f"Parallel: {label}={v!r} must be an integer >= 1")
        for label in ("sequence_parallel", "dp_overlap", "tensor_overlap"):
            if not isinstance(getattr(self, label), bool):
                raise ParallelError(f"Parallel: {label}={getattr(self, label)!r} must be True or False")
        if self.recompute not in RECOMPUTE:
            raise ParallelError(f"Parallel: recompute={self.recompute!r} is not one of {RECOMPUTE}")
        if self.sharding not in SHARDING:
            raise ParallelError(f"Parallel: sharding={self.sharding!r} is not one of {SHARDING}")
        if self.schedule not in SCHEDULES:
            raise ParallelError(f"Parallel: schedule={self.schedule!r} is not one of {SCHEDULES}")
        if self.virtual > 1 and self.schedule != "interleaved":
            raise ParallelError(f"Parallel: virtual={self.virtual} needs schedule='interleaved' (got "
                                f"{self.schedule!r}); or set virtual=1")
        if self.sequence_parallel and self.tensor == 1:
            raise ParallelError("Parallel: sequence_parallel=True needs tensor > 1 (it splits norms and "
                                "dropout over the tensor group)")

    @property
    def devices(self) -> int:
        """Devices the job uses: ``tensor * pipeline * data``."""
        return self.tensor * self.pipeline * self.data

    @property
    def global_batch(self) -> int:
        """Sequences per iteration: ``data * microbatches * microbatch_size``."""
        return self.data * self.microbatches * self.microbatch_size

    @property
    def stages(self) -> int:
        """Model chunks in the pipeline: ``pipeline * virtual``."""
        return self.pipeline * self.virtual

    def workers(self, *, stage: int = 0, replica: int = 0) -> tuple[int, ...]:
        """The cluster workers of one stage's tensor group in data replica ``replica``."""
        base = stage * self.tensor * self.data + replica * self.tensor
        return tuple(range(base, base + self.tensor))

    def data_group(self, *, stage: int = 0, rank: int = 0) -> tuple[int, ...]:
        """The workers holding tensor rank ``rank`` of ``stage`` in every data replica."""
        base = stage * self.tensor * self.data + rank
        return tuple(base + r * self.tensor for r in range(self.data))

    def check(self, model: Transformer, cluster: Cluster | None = None, global_batch: int | None = None, *,
              allow_slow_tensor: bool = False, stage_layers: Sequence[int] | None = None) -> Parallel:
        """This plan if it divides the model, the batch and the cluster, else :class:`ParallelError`
        naming the numbers and the nearest valid choices.

        Args:
            stage_layers: blocks per pipeline stage where they are uneven (they must add up to the
                model's layers); None: ``layers / pipeline`` each, which must divide.
        """
        if model.heads % self.tensor:
            raise ParallelError(f"tensor={self.tensor} does not divide {model.name}'s {model.heads} "
                                f"attention heads; use tensor in "
                                f"{_nearest(_divisors(model.heads), self.tensor)}")
        if model.kv_heads % self.tensor and self.tensor % model.kv_heads:
            raise ParallelError(f"tensor={self.tensor} neither divides nor is a multiple of {model.name}'s "
                                f"{model.kv_heads} key/value heads; use tensor in "
                                f"{_nearest(_divisors(model.kv_heads), self.tensor)}")
        if model.ffn % self.tensor:
            raise ParallelError(f"tensor={self.tensor} does not divide ffn={model.ffn}; use tensor in "
                                f"{_nearest(_divisors(model.ffn), self.tensor)}")
        if stage_layers is not None:
            check_stage_layers(model, self, stage_layers)
        elif model.layers % self.stages:
            ok = [d for d in _divisors(model.layers) if d % self.virtual == 0]
            raise ParallelError(f"{model.name}'s {model.layers} layers do not split into pipeline x "
                                f"virtual = {self.pipeline} x {self.virtual} = {self.stages} equal stages; "
                                f"use pipeline x virtual in {_nearest(_divisors(model.layers), self.stages)}"
                                + (f" (with virtual={self.virtual}: pipeline in "
                                   f"{_nearest([d // self.virtual for d in ok], self.pipeline)})"
                                   if self.virtual > 1 else ""))
        if self.virtual > 1 and self.microbatches % self.pipeline:
            lo = self.microbatches - self.microbatches % self.pipeline
            raise ParallelError(f"interleaved 1F1B needs microbatches={self.microbatches} to be a multiple "
                                f"of pipeline={self.pipeline}; use {max(lo, self.pipeline)} or "
                                f"{lo + self.pipeline}")
        if global_batch is not None and global_batch != self.global_batch:
            per = global_batch // self.data if global_batch % self.data == 0 else None
            hint = (f"with data={self.data}: microbatches x microbatch_size = {per}, e.g. microbatch_size in "
                    f"{_nearest(_divisors(per), self.microbatch_size)} with microbatches = {per} / it"
                    if per else
                    f"data must divide it: data in {_nearest(_divisors(global_batch), self.data)}")
            raise ParallelError(f"global batch {global_batch} != data x microbatches x microbatch_size = "
                                f"{self.data} x {self.microbatches} x {self.microbatch_size} = "
                                f"{self.global_batch}; {hint}")
        if cluster is not None:
            self._check_cluster(cluster, allow_slow_tensor)
        return self

    def _check_cluster(self, cluster: Cluster, allow_slow_tensor: bool) -> None:
        if self.devices > cluster.num_workers:
            raise ParallelError(f"tensor x pipeline x data = {self.tensor} x {self.pipeline} x {self.data} = "
                                f"{self.devices} devices but cluster {cluster.name!r} has "
                                f"{cluster.num_workers}; lower a degree or use a bigger cluster")
        fast = cluster.block_size(0)
        if self.tensor > 1 and (self.tensor > fast or fast % self.tensor) and not allow_slow_tensor:
            raise ParallelError(f"tensor={self.tensor} does not fit the {fast} devices of cluster "
                                f"{cluster.name!r}'s fast level ({cluster.levels[0].name}); use tensor in "
                                f"{_divisors(fast)}, or pass allow_slow_tensor=True to price its "
                                "collectives over the slower links")

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Parallel:
        """Inverse of :meth:`to_dict`; unknown keys are refused by name."""
        bad = sorted(set(d) - {f.name for f in fields(cls)})
        if bad:
            raise ParallelError(f"Parallel.from_dict: unknown keys {bad}")
        return cls(**d)

    def describe(self) -> str:
        """One line for humans."""
        extra = [f"v={self.virtual}"] if self.virtual > 1 else []
        extra += ["sp"] if self.sequence_parallel else []
        extra += [self.sharding] if self.sharding != "none" else []
        return (f"t={self.tensor} p={self.pipeline} d={self.data} ({self.devices} devices), "
                f"{self.microbatches} x {self.microbatch_size} sequences per pipeline, {self.schedule}, "
                f"recompute {self.recompute}" + (", " + ", ".join(extra) if extra else ""))
