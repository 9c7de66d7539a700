"""Confirm the planner's choice by measurement on the machine at hand: the shortlist, run side by side.

:func:`confirm` trains a shortlist of a :class:`~pipelab.planner.PlanTable` (the default, the
planner's pick, the fastest prediction and the next best that fit) for real, round by round with the
candidates interleaved, so that what the machine does during a round reaches all of them alike, and
compares each candidate with the default's run of the same round. A candidate replaces the default
only when it was faster in more than half of the rounds; among those, the highest median ratio wins.
The simulator still does the search; a shared machine's noise (``reproductions/sim_accuracy``) is
why the measurement decides among the few it shortlists.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
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
    """What :func:`confirm` measured: ``table`` (one row per candidate run, see :data:`COLUMNS`;
    ``predicted`` and ``measured`` in samples/s over the same steady-state window, ``vs_default`` the
    median over the rounds of the candidate's ratio to the default's run of the same round, ``wins``
    the rounds it was faster than the default, ``per_round`` its samples/s round by round), ``row``
    the chosen candidate's index in the plan table, ``rounds``."""

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
    """``(plan-table row, role)`` of the candidates :func:`confirm` measures, default first: the
    default, the planner's pick, the fastest prediction, then the next ``top`` fastest that fit
    (each once; its first role names it)."""
    if top < 0:
        raise ValueError(f"top={top} must be >= 0")
    rows: list[tuple[int, str]] = [(int(str(table.default.name)), "default")]
    rows.append((int(str(table.best.name)), "pick"))
    rows.append((int(str(table.fastest.name)), "fastest"))
    ok = table.table[(table.table["status"] == "simulated") & table.table["fits"]]
    for i, name in enumerate(ok.sort_values("throughput", ascending=False, kind="stable").index[:top + 1]):
        rows.append((int(str(name)), f"next {i + 1}"))
    seen: set[int] = set()
    out = []
    for r, role in rows:
        if r not in seen:
            seen.add(r)
            out.append((r, role))
    return out


def steps_for(throughput: float, batch: int, seconds: float) -> int:
    """Minibatches for about ``seconds`` of steady state at ``throughput`` samples/s (plus a quarter
    for the warm-up and drain the window leaves out), at least 16 and at most 2,000."""
    if not seconds > 0:
        raise ValueError(f"seconds={seconds!r} must be > 0")
    n = math.ceil(seconds * max(throughput, 1e-9) / batch)
    return int(min(max(n + n // 4 + 4, 16), 2000))


def confirm(table: PlanTable, model_fn: Callable[[], torch.nn.Module], data: Callable[[], Iterable[Any]],
            loss_fn: Callable[[Any, Any], torch.Tensor],
            optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer], *,
            rows: Sequence[int] | None = None, top: int = 2, rounds: int = 3, seconds: float = 0.5,
            steps: int | None = None, backend: str = "gloo", timeout: float = 300.0,
            progress: bool = True, **train_options: Any) -> Confirmed:
    """Train the shortlist of ``table`` for real and choose by measurement (module docstring).

    ``model_fn``, ``data``, ``loss_fn``, ``optimizer``: as :func:`pipelab.train` (``data()`` yields
    minibatches of the profile's batch size, the one the table was planned for). ``rows``: plan-table
    rows to measure besides the default (default: :func:`shortlist` with ``top``). ``rounds``: rounds,
    the candidates interleaved in each (odd, so that "more than half" is a majority). ``seconds``: steady
    state per run, from each candidate's prediction (:func:`steps_for`), unless ``steps`` fixes the
    minibatches of every run. A candidate whose run fails is reported (``status``) and not chosen; the
    default's failing raises. Returns :class:`Confirmed`; its ``row`` is the plan table's index of
    the choice (``table.candidate(row)``).
    """
    if rounds < 1:
        raise ValueError(f"rounds={rounds} must be >= 1")
    if steps is not None and steps < 4:
        raise ValueError(f"steps={steps} must be >= 4 (the steady window leaves out warm-up and drain)")
    batch = table.profile.batch_size
    if rows is None:
        chosen_rows = shortlist(table, top)
    else:
        default = int(str(table.default.name))
        chosen_rows = [(default, "default")] + [(int(r), "asked") for r in dict.fromkeys(rows)
                                                if int(r) != default]
    known = set(int(str(i)) for i in table.table.index)
    for r, _ in chosen_rows:
        if r not in known:
            raise ValueError(f"row {r} is not in the plan table (rows 0..{len(table.candidates) - 1})")
        if not (table.table.loc[r, "status"] == "simulated" and bool(table.table.loc[r, "fits"])):
            raise ValueError(f"row {r} ({table.table.loc[r, 'method']!s}) was not simulated or does not fit "
                             "in memory: only simulated candidates that fit can be run")
    thr = table.table["throughput"].astype(float)
    plan_steps = {r: steps or steps_for(float(thr[r]), batch, seconds)
                  for r, _ in chosen_rows}
    predicted = {}
    for r, _ in chosen_rows:
        sim = table.simulate(r, minibatches=plan_steps[r])
        predicted[r] = sim.trace.steady_throughput(batch, sim.schedule.warmup_minibatches())
    got: dict[int, list[float]] = {r: [] for r, _ in chosen_rows}
    failed: dict[int, str] = {}

    from tqdm.auto import tqdm  # optional heavy import (notebook widget or terminal bar)
    bar = tqdm(total=rounds * len(chosen_rows), desc="confirming", unit="run", disable=not progress,
               leave=False)
    try:
        for _ in range(rounds):
            for r, role in chosen_rows:
                bar.update(1)
                if r in failed:
                    continue
                try:
                    run = table.train(r, model_fn, data, loss_fn, optimizer, steps=plan_steps[r],
                                      backend=backend, timeout=timeout, progress=False, **train_options)
                except Exception as e:   # a candidate that cannot run is reported, not chosen
                    if role == "default":
                        raise
                    failed[r] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    continue
                got[r].append(run.trace.steady_throughput(batch, run.schedule.warmup_minibatches()))
    finally:
        bar.close()

    default_row = chosen_rows[0][0]
    base = got[default_row]
    # each candidate's rounds against the default's run of the same round (none for a failed one)
    ratios = {r: [x / d for x, d in zip(got[r], base)] for r, _ in chosen_rows if r not in failed}
    out = []
    for r, role in chosen_rows:
        row = table.table.loc[r]
        paired = ratios.get(r, [])
        meas = statistics.median(got[r]) if paired else math.nan
        out.append({"row": r, "method": row["method"], "partitioner": row["partitioner"],
                    "config": row["config"], "microbatches": int(str(row["microbatches"])),
                    "chunks": row["chunks"], "role": role, "steps": plan_steps[r],
                    "predicted": predicted[r], "measured": meas,
                    "error": (predicted[r] - meas) / meas if paired else math.nan,
                    "vs_default": statistics.median(paired) if paired else math.nan,
                    "wins": sum(p > 1.0 for p in paired), "rounds": len(paired),
                    "rounds_vs_default": ", ".join(f"{p:.2f}" for p in paired),
                    "per_round": list(got[r]),
                    "chosen": False, "status": failed.get(r, "measured")})
    df = pd.DataFrame(out, columns=list(COLUMNS))
    pick = choose(ratios, default_row)
    df["chosen"] = df["row"] == pick
    return Confirmed(df, pick, rounds)


def choose(paired: Mapping[int, Sequence[float]], default: int) -> int:
    """The candidate that replaces ``default``, from each candidate's per-round ratios to the default's
    run of the same round: one faster than the default in more than half of its rounds and with a
    median ratio above 1; among those the highest median (the first listed on a tie); else
    ``default``."""
    best, best_ratio = default, 1.0
    for r, ratios in paired.items():
        if r == default or not ratios:
            continue
        wins = sum(x > 1.0 for x in ratios)
        med = statistics.median(ratios)
        if wins > len(ratios) / 2 and med > best_ratio:
            best, best_ratio = r, med
    return best


__all__ = ["COLUMNS", "Confirmed", "choose", "confirm", "shortlist", "steps_for"]
