"""The Plan record: which layers each pipeline stage runs, on how many replicas, on which workers.

Stage ``s`` runs the contiguous layers ``[start, end)`` on ``replicas`` workers ``ranks``, numbered
stage by stage. A worker is one schedule participant; with a tensor-parallel degree ``tensor`` > 1 it is
a group of ``tensor`` devices that execute the same actions on shards of the stage (Megatron-LM), so the
plan occupies ``num_devices = sum(replicas * tensor)`` devices. ``config`` is the PipeDream paper's
notation: ``"15-1"`` (replicas per stage), ``"straight"`` (no replication) or ``"16"`` (data parallelism).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pipelab.metrics as metrics
from pipelab._display import Described
from pipelab._io import read_record, write_record
from pipelab.ties import Tie, across_stages, describe_tie
from pipelab.tracing import TracingConfig

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: layers ``[start, end)`` replicated on ``replicas`` workers ``ranks``."""

    index: int
    start: int
    end: int
    replicas: int
    ranks: tuple[int, ...]
    in_flight: int = 1        # minibatches in flight at this stage in steady state (1F1B/PipeDream)
    versions: int = 1         # weight versions this stage keeps under the plan's method
    time_s: float = 0.0       # predicted busy seconds of one replica per minibatch (compute + comm)
    memory_bytes: int = 0     # predicted peak memory of one replica
    tensor: int = 1           # tensor-parallel degree: devices per replica, sharing its actions

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(int(r) for r in self.ranks))
        if self.start < 0 or self.end <= self.start:
            raise ValueError(f"stage {self.index}: layer range [{self.start}, {self.end}) is empty")
        if self.replicas < 1:
            raise ValueError(f"stage {self.index}: replicas={self.replicas} must be >= 1")
        if self.tensor < 1:
            raise ValueError(f"stage {self.index}: tensor={self.tensor} must be >= 1")
        if len(self.ranks) != self.replicas:
            raise ValueError(f"stage {self.index}: {self.replicas} replicas but {len(self.ranks)} ranks "
                             f"{self.ranks}; give one rank per replica")

    @property
    def num_layers(self) -> int:
        """Number of layers in the stage."""
        return self.end - self.start


@dataclass(frozen=True, repr=False)
class Plan(Described):
    """A partition of a profile's layers into stages, with the partitioner's predictions."""

    stages: tuple[Stage, ...]
    num_layers: int
    method: str = "manual"
    profile_fingerprint: str = ""
    model: str = ""
    cluster: str = ""
    batch_size: int = 1
    time_per_minibatch: float = float("nan")   # predicted steady-state seconds per minibatch
    speedup_over_dp: float = float("nan")      # predicted, against the "dp" plan on the same cluster
    memory_per_worker: tuple[int, ...] = ()    # predicted peak bytes, indexed by worker rank
    notes: dict[str, Any] = field(default_factory=dict)
    #: how the profile's model was traced into layers; train/launch/the bridge trace the same way
    tracing: TracingConfig = field(default_factory=TracingConfig)
    #: the profile's shared parameters (pipelab.ties); :meth:`shared` says which stages hold a copy
    ties: tuple[Tie, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "ties", tuple(self.ties))
        object.__setattr__(self, "memory_per_worker", tuple(int(m) for m in self.memory_per_worker))
        if not isinstance(self.tracing, TracingConfig):
            object.__setattr__(self, "tracing", TracingConfig.from_dict(self.tracing))
        self.validate()

    @property
    def num_stages(self) -> int:
        """Number of pipeline stages."""
        return len(self.stages)

    @property
    def num_workers(self) -> int:
        """Total workers (sum of replicas)."""
        return sum(s.replicas for s in self.stages)

    @property
    def num_devices(self) -> int:
        """Total devices: each worker is a tensor-parallel group of ``stage.tensor`` devices."""
        return sum(s.replicas * s.tensor for s in self.stages)

    def refuse_tensor(self, what: str, instead: str) -> None:
        """Raise ``ValueError`` naming the first stage with ``tensor > 1``: ``what`` (a sentence's subject,
        e.g. ``"pl.simulate"``) prices or runs each stage as one device; ``instead`` says what to use."""
        split = [s for s in self.stages if s.tensor > 1]
        if split:
            s = split[0]
            more = f" (and {len(split) - 1} more stage(s))" if len(split) > 1 else ""
            raise ValueError(f"stage {s.index} has tensor degree {s.tensor}{more}, but {what} treats each "
                             f"stage replica as one device and does not model a tensor-parallel group; "
                             f"{instead}")

    @property
    def replicas(self) -> tuple[int, ...]:
        """Replica count per stage."""
        return tuple(s.replicas for s in self.stages)

    @property
    def config(self) -> str:
        """Paper notation: ``"15-1"``, ``"straight"`` or ``"16"``."""
        reps = self.replicas
        if len(reps) == 1:
            return str(reps[0])
        return "straight" if all(r == 1 for r in reps) else "-".join(str(r) for r in reps)

    @property
    def noam(self) -> int:
        """PipeDream's NOAM: minibatches in flight = ceil(workers / input-stage replicas)."""
        return metrics.in_flight(self.replicas, 0)

    def stage_of_rank(self, rank: int) -> Stage:
        """The stage that worker ``rank`` runs."""
        for s in self.stages:
            if rank in s.ranks:
                return s
        raise ValueError(f"rank {rank} is not in this plan (workers 0..{self.num_workers - 1})")

    def stage_of_layer(self, layer: int) -> Stage:
        """The stage that runs layer index ``layer``."""
        for s in self.stages:
            if s.start <= layer < s.end:
                return s
        raise ValueError(f"layer {layer} is outside 0..{self.num_layers - 1}")

    def validate(self, profile: Any = None) -> None:
        """Raise ``ValueError`` saying what is wrong unless the stages tile ``[0, num_layers)`` (with
        ``profile``: and the plan was made for that profile's layers, cut only where tensors alone cross)."""
        if not self.stages:
            raise ValueError("a Plan needs at least one stage")
        if self.num_layers < 1:
            raise ValueError("a Plan needs num_layers >= 1")
        if len(self.stages) > self.num_layers:
            raise ValueError(f"Plan has {len(self.stages)} stages but the model has {self.num_layers} "
                             f"layers; use at most {self.num_layers} stages")
        expect = 0
        for i, s in enumerate(self.stages):
            if s.index != i:
                raise ValueError(f"stage at position {i} has index {s.index}; stages must be numbered 0..")
            if s.start != expect:
                raise ValueError(f"stage {i} starts at layer {s.start} but the previous stage ended at "
                                 f"{expect}; stages must be contiguous and cover every layer")
            expect = s.end
        if expect != self.num_layers:
            raise ValueError(f"stages end at layer {expect} but the model has {self.num_layers} layers")
        ranks = [r for s in self.stages for r in s.ranks]
        if sorted(ranks) != list(range(len(ranks))):
            raise ValueError(f"worker ranks {ranks} must be 0..{len(ranks) - 1}, each exactly once")
        if self.memory_per_worker and len(self.memory_per_worker) != len(ranks):
            raise ValueError("memory_per_worker needs one entry per worker")
        for t in self.ties:
            if t.layers[-1] >= self.num_layers:
                raise ValueError(f"tie {t.name} names layer {t.layers[-1]} of a plan of {self.num_layers} "
                                 "layers; partition the model's own profile")
        if profile is not None:
            if len(profile) != self.num_layers:
                raise ValueError(f"this plan is for a model of {self.num_layers} layers but the profile has "
                                 f"{len(profile)}; partition this profile again")
            if self.profile_fingerprint and profile.fingerprint() != self.profile_fingerprint:
                raise ValueError(f"this plan was made for another model ({self.model or 'unknown'}, "
                                 f"fingerprint {self.profile_fingerprint}) than the profile "
                                 f"({profile.model or 'unknown'}, {profile.fingerprint()}); partition again")
            if hasattr(profile, "check_starts"):   # only tensors cross a cut (Profile.blocked_cuts)
                profile.check_starts([st.start for st in self.stages[1:]])

    @classmethod
    def from_boundaries(cls, num_layers: int, boundaries: Sequence[int],
                        replicas: Sequence[int] | None = None, *, method: str = "manual", batch_size: int = 1,
                        tensor: int = 1, profile: Any = None, **kw: Any) -> Plan:
        """A plan from cut points (``boundaries=[3, 5]`` on 8 layers: stages [0,3) [3,5) [5,8)); ``replicas``
        (default all 1) per stage, ranks assigned in order; ``tensor`` is every stage's tensor degree.
        With ``profile``: checked against it (:meth:`validate`), a cut a non-tensor value crosses refused
        with the layers' names, and the profile's fingerprint and tracing recorded."""
        cuts = [0, *[int(b) for b in boundaries], num_layers]
        if any(b <= a for a, b in zip(cuts, cuts[1:])):
            raise ValueError(f"boundaries {list(boundaries)} must be strictly increasing inside "
                             f"1..{num_layers - 1}")
        reps = list(replicas) if replicas is not None else [1] * (len(cuts) - 1)
        if len(reps) != len(cuts) - 1:
            raise ValueError(f"{len(cuts) - 1} stages but {len(reps)} replica counts")
        first = [sum(reps[:i]) for i in range(len(reps))]    # each stage's first rank
        stages = tuple(Stage(index=i, start=a, end=b, replicas=r, ranks=tuple(range(first[i], first[i] + r)),
                             tensor=tensor)
                       for i, (a, b, r) in enumerate(zip(cuts, cuts[1:], reps)))
        if profile is not None:
            kw.setdefault("profile_fingerprint", profile.fingerprint())
            kw.setdefault("model", profile.model)
            kw.setdefault("tracing", profile.tracing)
            kw.setdefault("ties", profile.ties)
        plan = cls(stages=stages, num_layers=num_layers, method=method, batch_size=batch_size, **kw)
        if profile is not None:
            plan.validate(profile)
        return plan

    @classmethod
    def even(cls, num_layers: int, num_stages: int, **kw: Any) -> Plan:
        """Split ``num_layers`` into ``num_stages`` stages of (nearly) equal layer counts."""
        if not (1 <= num_stages <= num_layers):
            raise ValueError(f"num_stages={num_stages} must be in 1..{num_layers} (the number of layers)")
        bounds = [round(i * num_layers / num_stages) for i in range(1, num_stages)]
        return cls.from_boundaries(num_layers, bounds, **kw)

    def with_predictions(self, **kw: Any) -> Plan:
        """A copy with some fields replaced (predictions filled in by a partitioner or simulator)."""
        return replace(self, **kw)

    def shared(self) -> tuple[tuple[Tie, tuple[int, ...]], ...]:
        """The ties whose layers lie on two or more stages, each with the stages holding a copy."""
        return across_stages(self.ties, [(s.start, s.end) for s in self.stages])

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (without the schema envelope)."""
        d = asdict(self)
        d["stages"] = [asdict(s) for s in self.stages]
        d["ties"] = [t.to_dict() for t in self.ties]
        d["config"] = self.config
        d["tracing"] = self.tracing.to_dict()
        for k in ("time_per_minibatch", "speedup_over_dp"):
            if isinstance(d[k], float) and math.isnan(d[k]):
                d[k] = None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        """Inverse of :meth:`to_dict`."""
        try:
            d = dict(d)
            d.pop("config", None)
            stages = tuple(Stage(**{**s, "ranks": tuple(s["ranks"])}) for s in d.pop("stages"))
            for k in ("time_per_minibatch", "speedup_over_dp"):
                if d.get(k) is None:
                    d[k] = float("nan")
            d["memory_per_worker"] = tuple(d.get("memory_per_worker", ()))
            d["tracing"] = TracingConfig.from_dict(d.get("tracing"))
            d["ties"] = tuple(Tie.from_dict(t) for t in d.get("ties", ()))
            return cls(stages=stages, **d)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed plan JSON ({exc}); re-create it with "
                             "pl.partition(...).save()") from None

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the plan as JSON (atomically)."""
        return write_record(path, "plan", SCHEMA_VERSION, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Read a plan written by :meth:`save`."""
        d = read_record(path, "plan", SCHEMA_VERSION)   # less the envelope written by write_record
        return cls.from_dict({k: v for k, v in d.items() if k not in ("pipelab", "schema")})

    @property
    def assumes(self) -> str:
        """What ``time_per_minibatch`` assumes: microbatches, samples per replica, flush or not."""
        B, M = self.batch_size, int(self.notes.get("microbatches", 1) or 1)
        if self.notes.get("schedule") == "flush":
            return (f"M={M} microbatches of {B // M if B % M == 0 else B / M:g} samples, fill and drain "
                    f"(the flush) included")
        reps = max(self.replicas)
        who = f"each of {reps} replicas takes" if reps > 1 else "each stage takes"
        return f"steady state without a flush; {who} whole minibatches of {B} samples, M=1"

    def describe(self) -> str:
        """A few lines for humans: config, stages with layer ranges and ranks, predictions."""
        shape = (f"one stage on {self.num_workers} replicas" if self.num_stages == 1 else
                 f"{self.config}, {self.num_stages} stages on {self.num_workers} workers")
        lines = [f"Plan {shape} ({self.method}) for {self.model or 'model'} on {self.cluster or 'a cluster'}"]
        if not self.tracing.is_default:
            lines.append(f"  traced with {self.tracing.describe()}")
        lines += [f"  stage {s.index}: layers [{s.start}, {s.end}) x{s.replicas}"
                  + (f", tensor-parallel over {s.tensor} devices each" if s.tensor > 1 else "")
                  + f" on ranks {list(s.ranks)}"
                  + (f", {s.time_s * 1e3:.2f} ms per minibatch on one replica" if s.time_s else "")
                  for s in self.stages]
        lines += [f"  shared: {describe_tie(t, st)}; one weight, its gradients summed across those stages "
                  "at each update (methods with one weight version per minibatch; the others refuse it)"
                  for t, st in self.shared()]
        if not math.isnan(self.time_per_minibatch):
            t_ms = self.time_per_minibatch * 1e3
            lines.append(f"  predicted {t_ms:.2f} ms per minibatch of {self.batch_size}"
                         + (f", {self.speedup_over_dp:.2f}x over data parallel"
                            if not math.isnan(self.speedup_over_dp) else ""))
            lines.append(f"    (assumes {self.assumes})")
        return "\n".join(lines)
