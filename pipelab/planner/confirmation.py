"""Confirm the planner's choice by measurement: the shortlist of a plan table, trained side by side.

Round by round, the candidates interleaved, each run is compared with the default's run of the same
round; a candidate replaces the default only when it was faster in more than half of the rounds, and
among those the highest median ratio wins. The simulator searches; the measurement decides among the few.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import pandas as pd

from pipelab._display import Described

if TYPE_CHECKING:
    import torch

    from pipelab.planner.search import PlanTable

#: columns of :attr:`Confirmed.table`
COLUMNS = ("row", "method", "partitioner", "config", "microbatches", "chunks", "role", "steps",
           "predicted", "measured", "error", "vs_default", "wins", "rounds", "rounds_vs_default", "per_round",
           "chosen", "status")


@dataclass(frozen=True, repr=False)
class Confirmed(Described):
    """What :func:`confirm` measured: ``table`` (one row per candidate, :data:`COLUMNS`; samples/s over
    one steady window; ``vs_default`` the median per-round ratio to the default), ``row`` (the choice)."""

    table: pd.DataFrame
    row: int
    rounds: int

    @property
    def best(self) -> pd.Series:
        """The chosen candidate's row of :attr:`table`."""
        return self.table[self.table["chosen"]].iloc[0]

    def describe(self) -> str:
        """The measured shortlist as text."""
        t = self.table.copy()
        for c in ("predicted", "measured"):
            t[c] = t[c].map("{:.0f}".format)
        t["error"] = t["error"].map("{:+.1%}".format)
        t["vs_default"] = t["vs_default"].map("{:.2f}x".format)
        cols = ["method", "partitioner", "config", "microbatches", "role", "predicted", "measured", "error",
                "vs_default", "wins", "rounds_vs_default", "chosen", "status"]
        return f"measured side by side, {self.rounds} rounds\n" + t[cols].to_string(index=False)


def shortlist(table: PlanTable, top: int = 2) -> list[tuple[int, str]]:
    """``(plan-table row, role)`` to measure, each once: default, pick, fastest, the next ``top`` that fit."""
    if top < 0:
        raise ValueError(f"top={top} must be >= 0")
    ok = table.table[(table.table["status"] == "simulated") & table.table["fits"]]
    fastest = ok.sort_values("throughput", ascending=False, kind="stable").index[:top + 1]
    rows = [(table.default.name, "default"), (table.best.name, "pick"), (table.fastest.name, "fastest"),
            *((name, f"next {i + 1}") for i, name in enumerate(fastest))]
    roles: dict[int, str] = {}
    for name, role in rows:
        roles.setdefault(int(str(name)), role)     # each row once, under its first role
    return list(roles.items())


def steps_for(throughput: float, batch: int, seconds: float) -> int:
    """Minibatches for about ``seconds`` of steady state (plus a quarter for warm-up and drain), 16..2000."""
    if not seconds > 0:
        raise ValueError(f"seconds={seconds!r} must be > 0")
    n = math.ceil(seconds * max(throughput, 1e-9) / batch)
    return int(min(max(n + n // 4 + 4, 16), 2000))


@dataclass(frozen=True)
class ConfirmOptions:
    """How :func:`confirm` measures (each field also a keyword): ``rows`` besides the default (None:
    :func:`shortlist` with ``top``); ``rounds`` (odd); ``seconds`` of steady state per run, or ``steps``."""

    rows: Sequence[int] | None = None
    top: int = 2
    rounds: int = 3
    seconds: float = 0.5
    steps: int | None = None
    progress: bool = True


def confirm(table: PlanTable, model_fn: Callable[[], torch.nn.Module], data: Callable[[], Iterable[Any]],
            loss_fn: Callable[[Any, Any], torch.Tensor],
            optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer],
            options: ConfirmOptions | None = None, **keywords: Any) -> Confirmed:
    """Train the shortlist of ``table`` for real and choose by measurement (module docstring).

    ``model_fn``, ``data``, ``loss_fn``, ``optimizer``: as :func:`pipelab.train`, ``data()`` yielding
    minibatches of the profile's batch size. ``keywords`` naming a :class:`ConfirmOptions` field
    (``rounds=5``, ``steps=8``, ...) set it; the rest go to ``train`` (``backend``, ``timeout``, ...).
    A candidate whose run fails is reported (``status``) and not chosen; the default's failing raises.
    """
    mine = {k: keywords.pop(k) for k in [f.name for f in fields(ConfirmOptions)] if k in keywords}
    opts = replace(options or ConfirmOptions(), **mine)
    if opts.rounds < 1:
        raise ValueError(f"rounds={opts.rounds} must be >= 1")
    if opts.steps is not None and opts.steps < 4:
        raise ValueError(f"steps={opts.steps} must be >= 4 (the steady window leaves out warm-up and drain)")
    chosen = _rows(table, opts)
    batch = table.profile.batch_size
    thr = table.table["throughput"].astype(float)
    steps = {r: opts.steps or steps_for(float(thr[r]), batch, opts.seconds) for r, _ in chosen}
    sims = {r: table.simulate(r, minibatches=steps[r]) for r, _ in chosen}
    predicted = {r: s.trace.steady_throughput(batch, s.schedule.warmup_minibatches())
                 for r, s in sims.items()}
    run = functools.partial(table.train, model_fn=model_fn, data=data, loss_fn=loss_fn, optimizer=optimizer,
                            progress=False, **keywords)
    got, failed = _measure(chosen, steps, run, opts, batch)
    base = got[chosen[0][0]]
    # each candidate's rounds against the default's run of the same round (none for a failed one)
    ratios = {r: [x / d for x, d in zip(got[r], base)] for r, _ in chosen if r not in failed}
    out = []
    for r, role in chosen:
        row = table.table.loc[r]
        paired = ratios.get(r, [])
        meas = statistics.median(got[r]) if paired else math.nan
        out.append({"row": r, "method": row["method"], "partitioner": row["partitioner"],
                    "config": row["config"], "microbatches": int(str(row["microbatches"])),
                    "chunks": row["chunks"], "role": role, "steps": steps[r],
                    "predicted": predicted[r], "measured": meas,
                    "error": (predicted[r] - meas) / meas if paired else math.nan,
                    "vs_default": statistics.median(paired) if paired else math.nan,
                    "wins": sum(p > 1.0 for p in paired), "rounds": len(paired),
                    "rounds_vs_default": ", ".join(f"{p:.2f}" for p in paired),
                    "per_round": list(got[r]), "chosen": False, "status": failed.get(r, "measured")})
    df = pd.DataFrame(out, columns=list(COLUMNS))
    pick = choose(ratios, chosen[0][0])
    df["chosen"] = df["row"] == pick
    return Confirmed(df, pick, opts.rounds)


def _rows(table: PlanTable, opts: ConfirmOptions) -> list[tuple[int, str]]:
    """``(plan-table row, role)`` to measure, default first; a row that cannot run raises."""
    if opts.rows is None:
        chosen = shortlist(table, opts.top)
    else:
        default = int(str(table.default.name))
        chosen = [(default, "default")] + [(int(r), "asked") for r in dict.fromkeys(opts.rows)
                                           if int(r) != default]
    known = set(int(str(i)) for i in table.table.index)
    for r, _ in chosen:
        if r not in known:
            raise ValueError(f"row {r} is not in the plan table (rows 0..{len(table.candidates) - 1})")
        if not (table.table.loc[r, "status"] == "simulated" and bool(table.table.loc[r, "fits"])):
            raise ValueError(f"row {r} ({table.table.loc[r, 'method']!s}) was not simulated or does not fit "
                             "in memory: only simulated candidates that fit can be run")
    return chosen


def _measure(chosen: list[tuple[int, str]], steps: Mapping[int, int], run: Callable[..., Any],
             opts: ConfirmOptions, batch: int) -> tuple[dict[int, list[float]], dict[int, str]]:
    """Each row's steady samples/s round by round, the rows interleaved; and why each failed row failed."""
    from tqdm.auto import tqdm

    got: dict[int, list[float]] = {r: [] for r, _ in chosen}
    failed: dict[int, str] = {}
    with tqdm(total=opts.rounds * len(chosen), desc="confirming", unit="run", disable=not opts.progress,
              leave=False) as bar:
        for _ in range(opts.rounds):
            for r, role in chosen:
                bar.update(1)
                if r in failed:
                    continue
                try:
                    res = run(r, steps=steps[r])
                except Exception as e:   # a candidate that cannot run is reported, not chosen
                    if role == "default":
                        raise
                    failed[r] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    continue
                got[r].append(res.trace.steady_throughput(batch, res.schedule.warmup_minibatches()))
    return got, failed


def choose(paired: Mapping[int, Sequence[float]], default: int) -> int:
    """The row that replaces ``default`` given per-round ratios to it: faster in most rounds, highest
    median above 1 (first listed on a tie); else ``default``."""
    best, best_ratio = default, 1.0
    for r, ratios in paired.items():
        if r == default or not ratios:
            continue
        wins = sum(x > 1.0 for x in ratios)
        med = statistics.median(ratios)
        if wins > len(ratios) / 2 and med > best_ratio:
            best, best_ratio = r, med
    return best
