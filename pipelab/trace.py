"""The Trace record: what happened (or would happen) on every worker, action by action.

The simulator and the runtime both produce a :class:`Trace`; views draw it. One :class:`Event` per
action (``F``, ``B``, ``W``, ``U``) and optionally per transfer (``send``, ``recv``, ``allreduce``),
in seconds from the run's start. A replicated stage's update is an ``allreduce`` (measured: from the
``U``'s start, the wait for the other replicas included) then a ``U`` holding the optimizer step alone,
so busy time means the same in a simulated and a measured trace.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pipelab.metrics as metrics
from pipelab._display import Described
from pipelab._io import atomic_write_text
from pipelab.metrics import COMPUTE_KINDS

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Event:
    """One action (or transfer) on one worker.

    ``weight_version``: the version of the stage's weights the action read (-1: not tracked); ``step``:
    the action's index in its worker's list (-1 for transfers).
    """

    worker: int
    stage: int
    kind: str
    microbatch: int
    start_s: float
    end_s: float
    bytes: int = 0
    weight_version: int = -1
    step: int = -1
    peer: int = -1

    @property
    def duration_s(self) -> float:
        """``end_s - start_s``."""
        return self.end_s - self.start_s

    @property
    def action(self) -> str:
        """The action's text form, e.g. ``"1F0"``."""
        return f"{self.stage}{self.kind}{self.microbatch}"


@dataclass(frozen=True, repr=False)
class Trace(Described):
    """An ordered collection of :class:`Event` plus free-form metadata (method, plan config, ...)."""

    events: tuple[Event, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(self.events))

    def __len__(self) -> int:
        return len(self.events)

    def describe(self) -> str:
        """One line: what ran, how many events on how many workers, over how long."""
        m = self.meta
        what = ", ".join(f"{k} {m[k]}" for k in ("method", "config", "backend", "microbatches", "minibatches",
                                                   "batch_size") if k in m)
        return (f"Trace ({what}): {len(self.events)} events on {len(self.workers)} workers over "
                f"{self.makespan * 1e3:.2f} ms")

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    @property
    def workers(self) -> tuple[int, ...]:
        """Sorted worker ids that appear in the trace."""
        return tuple(sorted({e.worker for e in self.events}))

    def compute_events(self) -> tuple[Event, ...]:
        """Only F/B/W/U events."""
        return tuple(e for e in self.events if e.kind in COMPUTE_KINDS)

    def actions_by_worker(self) -> dict[int, list[str]]:
        """Per worker, its compute actions' text forms in execution order (by step, then start)."""
        out: dict[int, list[Event]] = {}
        for e in self.compute_events():
            out.setdefault(e.worker, []).append(e)
        return {w: [e.action for e in sorted(evs, key=lambda e: (e.step, e.start_s))]
                for w, evs in out.items()}

    @property
    def makespan(self) -> float:
        """Seconds from the first start to the last end (0 for an empty trace)."""
        return metrics.span(self.events)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per event, with a ``duration_s`` column."""
        import pandas as pd

        df = pd.DataFrame([asdict(e) for e in self.events], columns=list(Event.__dataclass_fields__))
        df["duration_s"] = df["end_s"] - df["start_s"]
        return df

    def to_chrome_trace(self, path: str | os.PathLike[str]) -> Path:
        """Write Chrome trace-event JSON (opens in Perfetto or chrome://tracing): one event per action."""
        evs = [{"name": e.action, "cat": e.kind, "ph": "X", "pid": 0, "tid": e.worker, "ts": e.start_s * 1e6,
                "dur": max(e.end_s - e.start_s, 0.0) * 1e6,
                "args": {"stage": e.stage, "microbatch": e.microbatch, "bytes": e.bytes,
                         "weight_version": e.weight_version, "step": e.step, "peer": e.peer,
                         "start_s": e.start_s, "end_s": e.end_s}} for e in self.events]
        meta = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": w, "args": {"name": f"worker {w}"}}
                for w in self.workers]
        doc = {"traceEvents": meta + evs, "displayTimeUnit": "ms", "otherData": _jsonable(self.meta)}
        return atomic_write_text(path, json.dumps(doc))

    @classmethod
    def load_chrome_trace(cls, path: str | os.PathLike[str]) -> Trace:
        """Read a file written by :meth:`to_chrome_trace` back (exact times from the events' args)."""
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
            events = [Event(worker=int(ev["tid"]), kind=str(ev["cat"]), **ev["args"])
                      for ev in doc["traceEvents"] if ev.get("ph") == "X"]
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path} is not a Chrome trace written by Trace.to_chrome_trace ({exc})") \
                from None
        return cls(events=tuple(events), meta=dict(doc.get("otherData", {})))

    def busy_time(self, start: float | None = None, end: float | None = None) -> dict[int, float]:
        """Per worker, seconds spent in compute actions (F/B/W/U), clipped to ``[start, end]`` if given."""
        return metrics.busy_time(self.events, self.workers, start, end)

    def bubble_fraction(self) -> dict[int, float]:
        """Per worker, the idle fraction of the trace's span (1 - busy / makespan)."""
        return metrics.bubble_by_worker(self.busy_time(), self.makespan)

    def steady_window(self, in_flight: int = 1) -> tuple[float, float, int]:
        """``(start, end, minibatches)`` between minibatch completions without ``in_flight`` (at least
        one) of warm-up and as many of drain: the same window for a simulated and a measured trace."""
        K = int(self.meta.get("minibatches", 0))
        if K < 3:
            raise ValueError(f"a trace of {K} minibatches has no steady window; run at least 3")
        window = metrics.steady_window(self._completions(), min(max(in_flight, 1), (K - 1) // 2), 1)
        if window is None:
            raise ValueError(f"a trace of {K} minibatches is too short for a steady window; run more steps")
        return window

    def steady_throughput(self, batch_size: int | None = None, in_flight: int = 1) -> float:
        """Samples per second over :meth:`steady_window` (``batch_size`` defaults to the trace's)."""
        batch = self._batch(batch_size)
        start, end, n = self.steady_window(in_flight)
        return n * batch / (end - start)

    def steady_rounds(self, rounds: int = 5, batch_size: int | None = None,
                      in_flight: int = 1) -> list[float]:
        """Samples per second of ``rounds`` equal parts of :meth:`steady_window` (how a run's rate moves)."""
        batch = self._batch(batch_size)
        start, end, n = self.steady_window(in_flight)
        if not 1 <= rounds <= n:
            raise ValueError(f"rounds={rounds} must be in 1..{n}, the minibatches of the steady window")
        done = self._completions()
        first = done.index(start)             # the window runs from completion ``first`` to ``first + n``
        cuts = [first + round(j * n / rounds) for j in range(rounds + 1)]
        return [(b - a) * batch / (done[b] - done[a]) for a, b in zip(cuts, cuts[1:])]

    def _batch(self, batch_size: int | None) -> int:
        batch = batch_size if batch_size is not None else self.meta.get("batch_size")
        if batch is None:
            raise ValueError("this trace does not record its batch size; pass batch_size=")
        return int(batch)

    def _completions(self) -> list[float]:
        M, K = int(self.meta.get("microbatches", 1)), int(self.meta.get("minibatches", 0))
        return metrics.minibatch_completions(self.compute_events(), M, K)

    def save_jsonl(self, path: str | os.PathLike[str]) -> Path:
        """Write one JSON object per line (first line: metadata), atomically."""
        lines = [json.dumps({"meta": _jsonable(self.meta)}), *(json.dumps(asdict(e)) for e in self.events)]
        return atomic_write_text(path, "\n".join(lines) + "\n")

    @classmethod
    def load_jsonl(cls, path: str | os.PathLike[str]) -> Trace:
        """Read a trace written by :meth:`save_jsonl` (or streamed by the runtime)."""
        meta: dict[str, Any] = {}
        events = []
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    raise ValueError(f"{path}:{n} is not a JSON line; the trace file is corrupt") from None
                if "meta" in obj and len(obj) == 1:
                    meta = obj["meta"]
                else:
                    events.append(Event(**obj))
        return cls(events=tuple(events), meta=meta)

    @classmethod
    def from_events(cls, events: Iterable[Event], **meta: Any) -> Trace:
        """Build a trace from any iterable of events, sorted by (worker, start)."""
        return cls(events=tuple(sorted(events, key=lambda e: (e.worker, e.start_s, e.step))), meta=dict(meta))


def _jsonable(obj: Any) -> Any:
    """Best-effort conversion of metadata to JSON-safe values."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)
