"""The planner's decision: which row of a ranked table replaces the default, given the simulator's error.

The rule (see :mod:`pipelab.planner`): a candidate replaces the default (1F1B on a uniform split)
only when it is predicted faster than the default by more than ``margin``, the simulator's relative
throughput error; among such candidates, those within ``margin`` of the fastest cannot be told apart
by the simulator, and the simplest of them is picked (:func:`_simpler`). Pure functions of a table.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

#: the calibrated simulator's relative error of throughput: the median |error| over the 16 runs of
#: ``reproductions/sim_accuracy`` (results.md, 2026-11-25: 0.295, every method on the digits CNN and
#: the transformer stack, 2 gloo workers); the default ``margin`` of :func:`plan` on a calibrated
#: cluster. :func:`margin_from_accuracy` reads it from a newer results table.
SIM_ERROR = 0.30
#: what a one-stage candidate of a pipelining method is (column ``equivalent``)
ONE_STAGE_SYNC = "dp with gradient accumulation (one stage: no pipeline)"
ONE_STAGE_ASYNC = ("collapsed: one stage is no pipeline and never stale: data parallelism with each replica "
                   "a whole minibatch (replicas x the batch per update); see the dp rows")


def _simpler(table: pd.DataFrame, i: Any) -> tuple[Any, ...]:
    """How complex row ``i``'s plan is, for ties: asynchronous, stages, not ``dp`` itself, chunks,
    recomputation, compression, microbatches, peak memory, then table order (smaller is simpler)."""
    r = table.loc[i]
    return (not bool(r["synchronous"]), int(r["stages"]), r["method"] != "dp", int(r["chunks"]),
            bool(r["recompute"]), r["compression"] != "none", int(r["microbatches"]),
            float(r["peak_memory"]), i)


def decide(table: pd.DataFrame, default: int | None, margin: float) -> pd.DataFrame:
    """Columns ``vs_default``, ``within_error`` and ``pick`` of a ranked table (module docstring).

    ``vs_default``: predicted throughput over the default's (row ``default``); ``within_error``:
    ``1 / (1 + margin) <= vs_default <= 1 + margin``; ``pick``: the one chosen row. Candidates are
    the simulated rows that fit; when the default is one of them, only a candidate predicted faster
    than it by more than ``margin`` may replace it (when none is, the default is the pick); of those,
    the ones within ``margin`` of the fastest are a tie the simulator cannot break, and the simplest
    (:func:`_simpler`) wins. Without the default among the candidates, the same tie rule applies to
    all of them. ``margin = 0`` picks the fastest (ties to 9 significant digits). Pure: the same table
    gives the same pick.
    """
    table = table.copy()
    ok = (table["status"] == "simulated") & table["fits"].astype(bool)
    thr = table["throughput"].astype(float)
    base = float(thr.loc[default]) if default is not None and default in table.index else math.nan
    table["vs_default"] = thr / base
    ratio = table["vs_default"]
    table["within_error"] = ok & (ratio <= 1 + margin) & (ratio >= 1 / (1 + margin))
    table["pick"] = False
    default_ok = default is not None and bool(ok.get(default, False))
    pool = [i for i in table.index[ok] if not default_ok or ratio[i] > (1 + margin) * (1 + 1e-9)]
    if pool:
        top = max(float(f"{thr[i]:.9g}") for i in pool)
        tied = [i for i in pool if float(f"{thr[i]:.9g}") * (1 + margin) >= top]
        chosen = min(tied, key=lambda i: _simpler(table, i))
    elif default_ok:
        chosen = default
    else:
        return table
    table.loc[chosen, "pick"] = True
    return table


def margin_from_accuracy(results: pd.DataFrame | str) -> float:
    """The median |throughput error| of a ``reproductions/sim_accuracy`` results table (a DataFrame
    or the path of its ``results.csv``, column ``error``): a measured ``margin`` for :func:`plan`."""
    df = pd.read_csv(results) if isinstance(results, str) else results
    if "error" not in df or df["error"].dropna().empty:
        raise ValueError("margin_from_accuracy needs sim_accuracy's results with an 'error' column "
                         "(reproductions/sim_accuracy/results.csv)")
    return float(df["error"].dropna().abs().median())


__all__ = ["ONE_STAGE_ASYNC", "ONE_STAGE_SYNC", "SIM_ERROR", "decide", "margin_from_accuracy"]
