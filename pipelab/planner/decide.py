"""The planner's decision: which row of a ranked table replaces the default, given the simulator's error.

A prediction with relative error at most ``e`` (``|predicted - measured| <= e x measured``) says that
the measured throughput lies in ``[predicted / (1 + e), predicted / (1 - e)]``. A candidate replaces
the default (1F1B on a uniform split) only when the two intervals do not overlap, i.e. when it is
sure to be faster:

    predicted_c / (1 + e_c)  >  predicted_default / (1 - e_default)

with ``e`` the simulator's measured error for each row's method (``margin``: one number for every
method, or a mapping method -> error, as :func:`margin_from_accuracy` reads it from
``reproductions/sim_accuracy``; a pipelining method on one replicated stage is data parallelism and
takes ``dp``'s error). Among the candidates that qualify, those whose interval reaches the lower end
of the fastest's are a tie the simulator cannot break, and the simplest of them wins
(:func:`_simpler`). ``margin = 0`` picks the fastest. Pure functions of a table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from pipelab._io import atomic_write_text

#: where :data:`SIM_ERRORS` is kept: written by ``reproductions/sim_accuracy`` (``make reproduce``) from
#: the results it commits, so the planner's margin is the error last measured, never a copy of it
ERRORS_FILE = Path(__file__).resolve().parent.parent / "data" / "sim_errors.json"


def load_errors(path: str | Path = ERRORS_FILE) -> dict[str, float]:
    """The per-method errors of a file :func:`write_errors` wrote (``{"errors": {method: error}}``)."""
    try:
        doc = json.loads(Path(path).read_text())
        errors = {str(k): float(v) for k, v in doc["errors"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a simulator-error file ({e}); rewrite it with "
                         "`pipelab reproduce --only sim_accuracy`") from e
    check_margin(errors)
    return errors


def write_errors(results: pd.DataFrame | str, path: str | Path = ERRORS_FILE, *,
                 source: str = "") -> dict[str, float]:
    """Write the per-method errors of a sim_accuracy results table (:func:`margin_from_accuracy`, each
    rounded up to 0.01 and at most 0.99, the largest error a margin can be) to ``path`` atomically, with
    ``source`` (what was measured, where, when)."""
    errors = {m: min(math.ceil(e * 100 - 1e-9) / 100, 0.99) for m, e in margin_from_accuracy(results).items()}
    doc = {"source": source, "errors": errors}
    atomic_write_text(Path(path), json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return errors


#: what a one-stage candidate of a pipelining method is (column ``equivalent``)
ONE_STAGE_SYNC = "dp with gradient accumulation (one stage: no pipeline)"
ONE_STAGE_ASYNC = ("collapsed: one stage is no pipeline and never stale: data parallelism with each replica "
                   "a whole minibatch (replicas x the batch per update); see the dp rows")

Margin = float | Mapping[str, float]


def check_margin(margin: Any) -> Margin:
    """``margin`` if it is a relative error in ``[0, 1)`` or a mapping of method names to such; else a
    ValueError saying what to pass."""
    values = list(margin.values()) if isinstance(margin, Mapping) else [margin]
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1
                         for v in values):
        raise ValueError(f"margin={margin!r} must be a relative error in [0, 1) (0.3: predictions within "
                         f"30% of measurements), or a mapping method -> such (see planner.SIM_ERRORS)")
    return {str(k): float(v) for k, v in margin.items()} if isinstance(margin, Mapping) else float(margin)


def error_of(margin: Margin, method: str, equivalent: str = "") -> float:
    """The error ``margin`` gives a row of ``method`` (``dp``'s where the row is data parallelism)."""
    if not isinstance(margin, Mapping):
        return float(margin)
    key = "dp" if equivalent else method
    return float(margin.get(key, margin.get("ALL", max(margin.values()))))


def _simpler(table: pd.DataFrame, i: Any) -> tuple[Any, ...]:
    """How complex row ``i``'s plan is, for ties: asynchronous, stages, not ``dp`` itself, chunks,
    recomputation, compression, microbatches, peak memory, then table order (smaller is simpler)."""
    r = table.loc[i]
    return (not bool(r["synchronous"]), int(r["stages"]), r["method"] != "dp", int(r["chunks"]),
            bool(r["recompute"]), r["compression"] != "none", int(r["microbatches"]),
            float(r["peak_memory"]), i)


def decide(table: pd.DataFrame, default: int | None, margin: Margin) -> pd.DataFrame:
    """Columns ``vs_default``, ``within_error`` and ``pick`` of a ranked table (module docstring).

    ``vs_default``: predicted throughput over the default's (row ``default``); ``within_error``: the
    row's interval of measured throughput overlaps the default's (the simulator cannot tell them
    apart); ``pick``: the one chosen row. Candidates are the simulated rows that fit; when the default
    is one of them it stays unless a candidate is surely faster; among those that are (or among all
    candidates, without a fitting default), the ones tied with the fastest go to the simplest. Pure:
    the same table gives the same pick, whatever its row order.
    """
    table = table.copy()
    margin = check_margin(margin)
    ok = (table["status"] == "simulated") & table["fits"].astype(bool)
    thr = table["throughput"].astype(float)
    equiv = table["equivalent"] if "equivalent" in table else pd.Series("", index=table.index)
    err = pd.Series([error_of(margin, m, q) for m, q in zip(table["method"], equiv)], index=table.index)
    low, high = thr / (1 + err), thr / (1 - err)
    base = float(thr.loc[default]) if default is not None and default in table.index else math.nan
    table["vs_default"] = thr / base
    default_ok = default is not None and bool(ok.get(default, False))
    d_low, d_high = math.nan, math.nan
    if default_ok and default is not None:
        d_low, d_high = float(low.loc[default]), float(high.loc[default])
    table["within_error"] = ok & (high >= d_low) & (low <= d_high) if default_ok else False
    table["pick"] = False
    slack = 1 + 1e-9    # float noise is no gain
    pool = [i for i in table.index[ok] if not default_ok or low[i] > d_high * slack]
    position = {i: k for k, i in enumerate(table.index)}
    if pool:
        top = max(pool, key=lambda i: (float(f"{thr[i]:.9g}"), -position[i]))
        tied = [i for i in pool if high[i] * slack >= low[top]]
        chosen = min(tied, key=lambda i: _simpler(table, i))
    elif default_ok:
        chosen = default
    else:
        return table
    table.loc[chosen, "pick"] = True
    return table


def margin_from_accuracy(results: pd.DataFrame | str) -> dict[str, float]:
    """Per method, the worst |throughput error| of a ``reproductions/sim_accuracy`` results table (a
    DataFrame or the path of its ``results.csv``: columns ``method`` and ``error``), and ``"ALL"``, the
    worst of all: a measured ``margin`` for :func:`pipelab.planner.plan`."""
    df = pd.read_csv(results) if isinstance(results, str) else results
    if "error" not in df or "method" not in df or df["error"].dropna().empty:
        raise ValueError("margin_from_accuracy needs sim_accuracy's results with columns 'method' and "
                         "'error' (reproductions/sim_accuracy/results.csv)")
    worst = df.dropna(subset=["error"]).assign(e=lambda d: d["error"].abs()).groupby("method")["e"].max()
    return {**{str(k): float(v) for k, v in worst.items()}, "ALL": float(worst.max())}


#: the calibrated simulator's relative throughput error per method: the worst |error| that
#: ``reproductions/sim_accuracy`` last measured for it (the digits CNN and a transformer stack on 2 gloo
#: workers of this project's 2-core machine; :data:`ERRORS_FILE`), ``"ALL"`` the worst of all, for a
#: method the matrix did not run. The default ``margin`` of :func:`pipelab.planner.plan` on a calibrated
#: cluster; :func:`margin_from_accuracy` reads another results table.
SIM_ERRORS: dict[str, float] = load_errors()

__all__ = ["ERRORS_FILE", "ONE_STAGE_ASYNC", "ONE_STAGE_SYNC", "SIM_ERRORS", "check_margin", "decide",
           "error_of", "load_errors", "margin_from_accuracy", "write_errors"]
