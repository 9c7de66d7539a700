"""The schedule IR: actions like ``1F0`` and per-worker ordered action lists.

An :class:`Action` is (stage, kind, microbatch): ``F`` forward, ``B`` backward (weight gradient too
unless the stage splits it off), ``W`` weight gradient, ``U`` optimizer step, whose ``microbatch``
field is the minibatch it closes. A :class:`Schedule` holds, per worker, the ordered actions, which
workers host each stage's replicas and, for multi-version methods, the version each action reads.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pipelab.metrics as metrics
from pipelab._display import Described
from pipelab._io import atomic_write_text

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
            raise ValueError(f"action {self.stage}{self.kind}{self.microbatch}: stage and microbatch must "
                             "be >= 0")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Inverse of ``str``: ``Action.parse("1F0") == Action(1, "F", 0)``."""
        m = _ACTION_RE.match(text)
        if not m:
            raise ValueError(f"{text!r} is not an action; write <stage><F|B|W|U><microbatch>, e.g. '1F0'")
        return cls(int(m.group(1)), m.group(2), int(m.group(3)))


@dataclass(frozen=True, repr=False)
class Schedule(Described):
    """Per-worker ordered action lists: ``stage_ranks[s]`` the workers hosting stage ``s``'s replicas;
    ``versions`` (None: single-version) the version each action reads (F, B, W) or produces (U);
    ``microbatches`` M per minibatch, ``minibatches`` K."""

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

    def describe(self) -> str:
        """A header line and the first steps of the per-worker grid."""
        opts = "".join(f", {k}={v}" for k, v in self.options.items() if k != "segments")
        head = (f"Schedule {self.method}: {self.num_stages} stages on {self.num_workers} workers, "
                f"M={self.microbatches} microbatches x K={self.minibatches} minibatches{opts}")
        return head + "\n" + self.grid(max_steps=16)

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

    def __str__(self) -> str:
        return self.grid()

    def grid(self, mark: tuple[int, int] | None = None, *, max_steps: int | None = None) -> str:
        """The schedule as text, one row per worker; ``mark=(worker, index)`` brackets that step and
        ``max_steps`` elides long rows around it."""
        longest = max((len(a) for a in self.actions), default=0)
        lo, hi = 0, longest
        if max_steps is not None and longest > max_steps:
            centre = mark[1] if mark is not None else 0
            lo = max(0, min(centre - max_steps // 2, longest - max_steps))
            hi = lo + max_steps
        rows: list[list[str]] = []
        for w, acts in enumerate(self.actions):
            cells = []
            for i in range(lo, min(hi, len(acts))):
                text = str(acts[i])
                if self.versions is not None and acts[i].kind != "U":
                    text += f"@{self.versions[w][i]}"
                cells.append(f"[{text}]" if mark == (w, i) else f" {text} ")
            rows.append(cells)
        width = max([len(c) for r in rows for c in r] + [len(str(hi))]) + 1
        head = " " * 6 + "".join(f" {i:<{width - 1}}" for i in range(lo, hi))
        lines = [f"{self.method} schedule: {self.num_stages} stages, {self.num_workers} workers, "
                 f"M={self.microbatches}, K={self.minibatches}", head.rstrip()]
        for w, cells in enumerate(rows):
            more = "..." if hi < len(self.actions[w]) else ""
            lines.append((f"w{w:<4}" + ("<" if lo > 0 else " ") + "".join(f"{c:<{width}}" for c in cells)
                          ).rstrip() + more)
        return "\n".join(lines)

    def versions_alive(self, worker: int) -> tuple[int, ...]:
        """For each action of ``worker``: distinct weight versions of its stage held right after it (a
        version is held while it is the latest or a later action still reads it; docs/schedules.md)."""
        acts = self.actions[worker]
        if self.versions is None:
            return tuple(1 for _ in acts)
        vers = self.versions[worker]
        # (stage, version) -> index of its last reader
        last_read = {(a.stage, vers[i]): i for i, a in enumerate(acts) if a.kind != "U"}
        latest: dict[int, int] = {}
        alive: dict[int, set[int]] = {}
        out: list[int] = []
        for i, a in enumerate(acts):
            s = a.stage
            held = alive.setdefault(s, {0})
            if a.kind == "U":
                latest[s] = vers[i]
                held.add(vers[i])
            cur = latest.get(s, 0)
            for v in [v for v in held if v != cur and last_read.get((s, v), -1) <= i]:
                held.discard(v)
            out.append(len(held))
        return tuple(out)

    def versions_held(self, stage: int) -> int:
        """Most weight versions of ``stage`` alive at once on any of its workers (closed forms per
        method: docs/schedules.md)."""
        if not 0 <= stage < self.num_stages:
            raise ValueError(f"stage {stage} is outside 0..{self.num_stages - 1}")
        return max([1, *(n for w in self.stage_ranks[stage]
                         for a, n in zip(self.actions[w], self.versions_alive(w)) if a.stage == stage)])

    def in_flight(self, stage: int) -> int:
        """Most microbatches of ``stage`` between their ``F`` and last gradient action on one worker
        (activations held). PipeDream: NOAM = ceil(workers / input replicas) at the input stage."""
        if not 0 <= stage < self.num_stages:
            raise ValueError(f"stage {stage} is outside 0..{self.num_stages - 1}")
        has_w = any(a.kind == "W" and a.stage == stage for acts in self.actions for a in acts)
        return max(metrics.most_live((a.kind for a in self.actions[w] if a.stage == stage), has_w)
                   for w in self.stage_ranks[stage])

    def warmup_minibatches(self) -> int:
        """Minibatches a run takes to fill (and to drain), at least one: a steady window leaves them out."""
        return max(1, -(-self.in_flight(0) * len(self.stage_ranks[0]) // self.microbatches))

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Save as CSV to edit by hand: a ``#``-line of JSON metadata, then rows ``w,<action>[@version]``."""
        meta = {"method": self.method, "num_stages": self.num_stages,
                "stage_ranks": [list(r) for r in self.stage_ranks], "microbatches": self.microbatches,
                "minibatches": self.minibatches, "options": self.options,
                "versions": self.versions is not None}
        buf = io.StringIO()
        buf.write("#" + json.dumps(meta, default=str) + "\n")
        writer = csv.writer(buf, lineterminator="\n")
        for w, acts in enumerate(self.actions):
            writer.writerow([w, *(str(a) + (f"@{self.versions[w][i]}" if self.versions is not None else "")
                                  for i, a in enumerate(acts))])
        return atomic_write_text(path, buf.getvalue())

    @classmethod
    def from_csv(cls, path: str | os.PathLike[str]) -> Schedule:
        """Read a schedule written by :meth:`to_csv` (possibly edited by hand)."""
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        if not lines or not lines[0].startswith("#"):
            raise ValueError(f"{path}: first line must be '#' + JSON metadata as written by Schedule.to_csv")
        try:
            meta = json.loads(lines[0][1:])
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: metadata line is not JSON ({exc}); re-save with "
                             "Schedule.to_csv") from None
        actions: list[list[Action]] = []
        versions: list[list[int]] = []
        for n, row in enumerate(csv.reader(lines[1:]), 2):
            if not row:
                continue
            if int(row[0]) != len(actions):
                raise ValueError(f"{path}:{n}: rows must be workers 0, 1, ... in order; found worker "
                                 f"{row[0]}")
            acts, vers = [], []
            for cell in row[1:]:
                text_a, _, ver = cell.strip().partition("@")
                try:
                    acts.append(Action.parse(text_a))
                except ValueError as exc:
                    raise ValueError(f"{path}:{n}: {exc}") from None
                vers.append(int(ver) if ver else 0)
            actions.append(acts)
            versions.append(vers)
        return cls(method=meta["method"], num_stages=meta["num_stages"],
                   stage_ranks=tuple(tuple(r) for r in meta["stage_ranks"]),
                   microbatches=meta["microbatches"], minibatches=meta["minibatches"],
                   actions=tuple(tuple(a) for a in actions),
                   versions=tuple(tuple(v) for v in versions) if meta.get("versions") else None,
                   options=dict(meta.get("options", {})))
