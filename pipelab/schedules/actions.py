"""The schedule IR: actions like ``1F0`` and per-worker ordered action lists.

An :class:`Action` is (stage, kind, microbatch): ``F`` forward, ``B`` backward (input gradient, and
weight gradient too unless the schedule splits it off), ``W`` weight gradient (zero-bubble
schedules), ``U`` optimizer step. For ``U`` the ``microbatch`` field holds the *minibatch* index
the update closes. For interleaved schedules ``stage`` is the virtual stage (chunk ``c`` of worker
``w`` in a ``P``-worker pipeline is stage ``c * P + w``).

A :class:`Schedule` is the single source of truth: the runtime executes it, the simulator times
it, the views draw it. It holds, per worker, the ordered list of actions, plus which workers host
each stage's replicas (microbatch ``m`` of stage ``s`` runs on replica ``m % replicas``, PipeDream's
round-robin) and, for methods that keep several weight versions, the version each action reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

KINDS = ("F", "B", "W", "U")
_ACTION_RE = re.compile(r"^\s*(\d+)([FBWU])(\d+)\s*$")


@dataclass(frozen=True, order=True)
class Action:
    """One step of a worker's program: ``Action(1, "F", 0)`` prints and parses as ``"1F0"``."""

    stage: int
    kind: str
    microbatch: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"action kind {self.kind!r} is not one of {KINDS}")
        if self.stage < 0 or self.microbatch < 0:
            raise ValueError(f"action {self.stage}{self.kind}{self.microbatch}: stage and microbatch must be >= 0")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Inverse of ``str``: ``Action.parse("1F0") == Action(1, "F", 0)``."""
        m = _ACTION_RE.match(text)
        if not m:
            raise ValueError(f"{text!r} is not an action; write <stage><F|B|W|U><microbatch>, e.g. '1F0'")
        return cls(int(m.group(1)), m.group(2), int(m.group(3)))


@dataclass(frozen=True)
class Schedule:
    """Per-worker ordered action lists and the facts needed to execute, time and draw them.

    ``stage_ranks[s]`` lists the workers hosting stage ``s``'s replicas, in replica order.
    ``versions`` (optional) parallels ``actions``: for each action the weight version it reads
    (F, B, W) or produces (U); ``None`` means the method keeps a single version.
    ``microbatches`` is M per minibatch, ``minibatches`` K; microbatch ``m`` belongs to minibatch
    ``m // M``.
    """

    method: str
    num_stages: int
    stage_ranks: tuple[tuple[int, ...], ...]
    microbatches: int
    minibatches: int
    actions: tuple[tuple[Action, ...], ...]
    versions: tuple[tuple[int, ...], ...] | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stage_ranks", tuple(tuple(int(r) for r in rs) for rs in self.stage_ranks))
        object.__setattr__(self, "actions", tuple(tuple(a) for a in self.actions))
        if self.versions is not None:
            object.__setattr__(self, "versions", tuple(tuple(int(v) for v in vs) for vs in self.versions))
            if len(self.versions) != len(self.actions) or any(
                    len(v) != len(a) for v, a in zip(self.versions, self.actions)):
                raise ValueError("versions must parallel actions: one entry per action of every worker")
        if len(self.stage_ranks) != self.num_stages:
            raise ValueError(f"stage_ranks has {len(self.stage_ranks)} entries for {self.num_stages} stages")

    @property
    def num_workers(self) -> int:
        """Number of workers (action lists)."""
        return len(self.actions)

    @property
    def num_microbatches(self) -> int:
        """Total microbatches over all minibatches (M * K)."""
        return self.microbatches * self.minibatches

    def minibatch_of(self, microbatch: int) -> int:
        """The minibatch a microbatch belongs to."""
        return microbatch // self.microbatches

    def worker_of(self, stage: int, microbatch: int) -> int:
        """The worker that runs ``stage`` for ``microbatch`` (round-robin over the stage's replicas)."""
        ranks = self.stage_ranks[stage]
        return ranks[microbatch % len(ranks)]

    def stages_of(self, worker: int) -> tuple[int, ...]:
        """Stages hosted by ``worker`` (several for interleaved schedules)."""
        return tuple(s for s, rs in enumerate(self.stage_ranks) if worker in rs)

    def version_of(self, worker: int, index: int) -> int:
        """Weight version read/written by action ``index`` of ``worker`` (0 if single-version)."""
        return 0 if self.versions is None else self.versions[worker][index]

    def __len__(self) -> int:
        return sum(len(a) for a in self.actions)
