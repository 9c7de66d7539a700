"""The planner's decision: which row of a ranked table replaces the default, given the simulator's error.

The simulator's signed relative error ``e = (predicted - measured) / measured`` of a method, measured
in ``[lo, hi]``, says that a prediction ``p`` means a measured throughput in
``[p / (1 + hi), p / (1 + lo)]``; an error of at most ``e`` either way is the range ``[-e, e]``, i.e.
``[p / (1 + e), p / (1 - e)]``. A candidate replaces the default (1F1B on a uniform split) only when
the two intervals do not overlap, i.e. when it is sure to be faster:

    predicted_c / (1 + hi_c)  >  predicted_default / (1 + lo_default)

``margin`` gives each row's method its range: one number ``e`` for every method, or a mapping method ->
``e`` or ``(lo, hi)``. It is an input, measured on the machine the plans are for: the errors file a
``reproductions/sim_accuracy``-style run writes there (:func:`write_errors`; :func:`load_margin` reads
it as the signed ranges of its errors less each run's common shift, :func:`less_shift`, which is what
comparing two predictions of one calibration needs), or a plain number. No host's measurements ship
as a default: without a margin the planner says so (:data:`NO_MARGIN`) and ranks by prediction alone
(``margin = 0``). A pipelining method on one replicated stage is data parallelism and takes ``dp``'s
range.
Among the candidates that qualify, those whose interval reaches the lower end of the fastest's are a
tie the simulator cannot break, and the simplest of them wins (:func:`_simpler`). ``margin = 0`` picks
the fastest. Pure functions of a table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from pipelab._io import atomic_write_text

#: what the planner says when it was given no margin (:func:`resolve_margin`)
NO_MARGIN = ("no simulator error given (margin=None): ranked by prediction alone. Measure the simulator "
             "on this machine (reproductions/sim_accuracy writes sim_errors.json) and pass margin= that "
             "file, or a relative error such as 0.2")


def _read(path: str | Path, values: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """``values(doc)`` of the JSON file ``path`` that :func:`write_errors` wrote, checked as a margin;
    a ValueError saying how to rewrite a file that is not one."""
    try:
        out = values(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise ValueError(f"{path}: not a simulator-error file ({e}); rewrite it with "
                         "`pipelab reproduce --only sim_accuracy`") from e
    check_margin(out)
    return out


def load_ranges(path: str | Path, *, relative: bool = False) -> dict[str, tuple[float, float]]:
    """The per-method signed error ranges of a file :func:`write_errors` wrote (``"ranges"``; a file
    with only ``"errors"`` gives ``(-e, e)``); with ``relative``, the ranges of the errors less each
    run's common shift (``"relative_ranges"``; a file without them gives the absolute ranges)."""
    def ranges(doc: dict[str, Any]) -> dict[str, tuple[float, float]]:
        raw = ((doc.get("relative_ranges") if relative else None) or doc.get("ranges")
               or {k: (-float(v), float(v)) for k, v in doc["errors"].items()})
        return {str(k): (float(v[0]), float(v[1])) for k, v in raw.items()}
    out: dict[str, tuple[float, float]] = _read(path, ranges)
    return out


def load_errors(path: str | Path) -> dict[str, float]:
    """The per-method errors of a file :func:`write_errors` wrote (``{"errors": {method: error}}``)."""
    out: dict[str, float] = _read(path, lambda doc: {str(k): float(v) for k, v in doc["errors"].items()})
    return out


def write_errors(results: pd.DataFrame | str, path: str | Path, *,
                 source: str = "", host: str | None = None, history: int = 5) -> dict[str, float]:
    """Write the per-method errors of a sim_accuracy results table (:func:`margin_from_accuracy`, each
    rounded up to 0.01 and at most 0.99, the largest error a margin can be) and their signed ranges
    (:func:`ranges_from_accuracy`, rounded outwards to 0.01) to ``path`` atomically, with ``source``
    (what was measured, where, when), and the ranges of the errors less each run's common shift
    (``relative=True``). Returns the errors written.

    With ``host`` (the calibrated machine's name), the file keeps the last ``history`` runs of that
    host (``"runs"``) and its errors and ranges are their union: one run's ranges do not hold the next
    run's errors on a shared machine). A file of another host, or without runs, starts the history anew."""
    if not isinstance(history, int) or isinstance(history, bool) or history < 1:
        raise ValueError(f"history={history!r} must be an int >= 1 (runs kept per host)")
    if isinstance(results, str):
        results = pd.read_csv(results)      # once, for the errors, both ranges and the held-out check

    def outwards(got: dict[str, tuple[float, float]]) -> dict[str, list[float]]:
        return {m: [math.floor(lo * 100 + 1e-9) / 100, math.ceil(hi * 100 - 1e-9) / 100]
                for m, (lo, hi) in got.items()}

    run = {"source": source,
           "errors": {m: min(math.ceil(e * 100 - 1e-9) / 100, 0.99)
                      for m, e in margin_from_accuracy(results).items()},
           "ranges": outwards(ranges_from_accuracy(results)),
           "relative_ranges": outwards(ranges_from_accuracy(results, relative=True))}
    runs: list[dict[str, Any]] = []
    if host is not None and Path(path).exists():
        try:
            old = json.loads(Path(path).read_text())
            if old.get("host") == host and isinstance(old.get("runs"), list):
                runs = [r for r in old["runs"] if isinstance(r, dict) and {"errors", "ranges"} <= set(r)]
        except (OSError, ValueError, AttributeError):
            runs = []
    if runs:
        # this run against the margin pooled from the runs before it: the coverage the planner had
        before = {m: (v[0], v[1]) for m, v in _union(runs, "relative_ranges").items()}
        got = held_out(results, before)
        run["held_out"] = {"inside": int(got["inside"].sum()), "of": len(got), "runs_before": len(runs)}
    runs = [*runs, run][-history:]
    names = {k for r in runs for k in r["errors"]}
    errors = {m: max(r["errors"][m] for r in runs if m in r["errors"]) for m in names}
    doc: dict[str, Any] = {"source": source, "errors": errors, "ranges": _union(runs, "ranges"),
                           "relative_ranges": _union(runs, "relative_ranges")}
    if host is not None:
        doc.update(host=host, runs=runs)
    check_margin({m: tuple(v) for m, v in doc["ranges"].items()})
    atomic_write_text(Path(path), json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return errors


def _union(runs: list[dict[str, Any]], key: str) -> dict[str, list[float]]:
    """Per method, the union of the ranges ``key`` of ``runs`` (records of :func:`write_errors`)."""
    out: dict[str, list[float]] = {}
    for r in runs:
        for m, (lo, hi) in (r.get(key) or r["ranges"]).items():
            was = out.get(m, [lo, hi])
            out[m] = [min(was[0], lo), max(was[1], hi)]
    return out


#: what a one-stage candidate of a pipelining method is (column ``equivalent``)
ONE_STAGE_SYNC = "dp with gradient accumulation (one stage: no pipeline)"
ONE_STAGE_ASYNC = ("collapsed: one stage is no pipeline and never stale: data parallelism with each replica "
                   "a whole minibatch (replicas x the batch per update); see the dp rows")

Bound = float | tuple[float, float]
Margin = float | Mapping[str, Bound]


def _is_error(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and 0 <= v < 1


def _is_range(v: Any) -> bool:
    return (isinstance(v, (tuple, list)) and len(v) == 2 and all(
        not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) for x in v)
        and -1 < v[0] <= v[1])


def check_margin(margin: Any) -> Margin:
    """``margin`` if it is a relative error in ``[0, 1)``, or a mapping of method names to such or to
    signed ranges ``(lo, hi)`` with ``-1 < lo <= hi``; else a ValueError saying what to pass."""
    values = list(margin.values()) if isinstance(margin, Mapping) else [margin]
    mapping = isinstance(margin, Mapping)
    if not values or any(not (_is_error(v) or (mapping and _is_range(v))) for v in values):
        raise ValueError(f"margin={margin!r} must be a relative error in [0, 1) (0.3: predictions within "
                         f"30% of measurements), or a mapping method -> such or -> a signed range (lo, hi) "
                         f"of (predicted - measured) / measured with -1 < lo <= hi (see "
                         f"planner.decide.load_margin)")
    if not mapping:
        return float(margin)
    return {str(k): (float(v[0]), float(v[1])) if isinstance(v, (tuple, list)) else float(v)
            for k, v in margin.items()}


def _as_range(v: Bound) -> tuple[float, float]:
    return (float(v[0]), float(v[1])) if isinstance(v, tuple) else (-float(v), float(v))


def bounds_of(margin: Margin, method: str, equivalent: str = "") -> tuple[float, float]:
    """The signed error range ``(lo, hi)`` ``margin`` gives a row of ``method`` (``dp``'s where the row
    is data parallelism; ``"ALL"``'s, else the widest, for a method it does not name)."""
    if not isinstance(margin, Mapping):
        return _as_range(float(margin))
    key = "dp" if equivalent else method
    if key in margin:
        return _as_range(margin[key])
    if "ALL" in margin:
        return _as_range(margin["ALL"])
    ranges = [_as_range(v) for v in margin.values()]
    return min(lo for lo, _ in ranges), max(hi for _, hi in ranges)


def error_of(margin: Margin, method: str, equivalent: str = "") -> float:
    """The largest |error| ``margin`` gives a row of ``method`` (``dp``'s where the row is data
    parallelism)."""
    lo, hi = bounds_of(margin, method, equivalent)
    return max(abs(lo), abs(hi))


def _simpler(table: pd.DataFrame, i: Any) -> tuple[Any, ...]:
    """How complex row ``i``'s plan is, for ties: asynchronous, stages, not ``dp`` itself, chunks,
    recomputation, compression, microbatches, peak memory, then table order (smaller is simpler)."""
    r = table.loc[i]
    return (not bool(r["synchronous"]), int(r["stages"]), r["method"] != "dp", int(r["chunks"]),
            bool(r["recompute"]), r["compression"] != "none", int(r["microbatches"]),
            float(r["peak_memory"]), i)


def decide(table: pd.DataFrame, default: int | None, margin: Margin) -> pd.DataFrame:
    """Columns ``vs_default``, ``needs_vs_default``, ``within_error`` and ``pick`` of a ranked table
    (module docstring).

    ``vs_default``: predicted throughput over the default's (row ``default``); ``needs_vs_default``:
    the ``vs_default`` the row would need to be surely faster than the default given both errors,
    ``(1 + hi_row) / (1 + lo_default)`` (NaN without a default that fits); ``within_error``: the
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
    bounds = [bounds_of(margin, m, q) for m, q in zip(table["method"], equiv)]
    lo_err = pd.Series([lo for lo, _ in bounds], index=table.index, dtype=float)
    hi_err = pd.Series([hi for _, hi in bounds], index=table.index, dtype=float)
    low, high = thr / (1 + hi_err), thr / (1 + lo_err)
    base = float(thr.loc[default]) if default is not None and default in table.index else math.nan
    table["vs_default"] = thr / base
    default_ok = default is not None and bool(ok.get(default, False))
    d_low, d_high = math.nan, math.nan
    table["needs_vs_default"] = math.nan
    if default_ok and default is not None:
        d_low, d_high = float(low.loc[default]), float(high.loc[default])
        # the predicted gain over the default a row needs to be surely faster: low > d_high
        table["needs_vs_default"] = (1 + hi_err) / (1 + float(lo_err.loc[default]))
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
    DataFrame or the path of its ``results.csv``: columns ``method`` and ``error``, and
    ``error_recalibrated`` where present), and ``"ALL"``, the worst of all: a measured ``margin`` for
    :func:`pipelab.planner.plan`."""
    df = pd.read_csv(results) if isinstance(results, str) else results
    if "error" not in df or "method" not in df or df["error"].dropna().empty:
        raise ValueError("margin_from_accuracy needs sim_accuracy's results with columns 'method' and "
                         "'error' (reproductions/sim_accuracy/results.csv)")
    df = _both_calibrations(df)
    worst = df.dropna(subset=["error"]).assign(e=lambda d: d["error"].abs()).groupby("method")["e"].max()
    return {**{str(k): float(v) for k, v in worst.items()}, "ALL": float(worst.max())}


def held_out(results: pd.DataFrame | str, margin: Margin) -> pd.DataFrame:
    """How a ``reproductions/sim_accuracy`` run's errors fall in a margin written before it: one row
    per configuration with ``method``, ``error`` less the run's shift (:func:`less_shift`; the errors
    of the same runs against the run's second calibration, less that calibration's shift, as more rows
    where the table has them), the margin's ``lo`` and ``hi`` for the method, and ``inside``. With the
    margin of the runs before (what the planner decided with), the share inside is the margin's
    measured coverage of a run it never saw."""
    df = pd.read_csv(results) if isinstance(results, str) else results
    if "error" not in df or "method" not in df or df["error"].dropna().empty:
        raise ValueError("held_out needs sim_accuracy's results with columns 'method' and 'error' "
                         "(reproductions/sim_accuracy/results.csv)")
    margin = check_margin(margin)
    df = _both_calibrations(df, relative=True).dropna(subset=["error"])
    bounds = [bounds_of(margin, str(m)) for m in df["method"]]
    out = pd.DataFrame({"method": df["method"].astype(str).to_numpy(), "error": df["error"].to_numpy(),
                        "lo": [lo for lo, _ in bounds], "hi": [hi for _, hi in bounds]})
    out["inside"] = (out["lo"] <= out["error"]) & (out["error"] <= out["hi"])
    return out


def less_shift(errors: pd.Series) -> pd.Series:
    """Signed errors relative to their common shift, the median: ``(1 + e) / (1 + median) - 1``.

    The configurations of one ``reproductions/sim_accuracy`` run are predicted from one calibration
    and one profile per model and run minutes later on the same machine, so whatever the machine's
    speed did in between moves all their errors together (the run's shift). Comparing two
    candidates on one calibration, as the planner does, that shift cancels: if
    ``e = (1 + s)(1 + r) - 1``, then ``measured_c / measured_d = (predicted_c / predicted_d)
    (1 + r_d) / (1 + r_c)``, whatever ``s``."""
    return (1 + errors) / (1 + float(errors.median())) - 1


def _both_calibrations(df: pd.DataFrame, relative: bool = False) -> pd.DataFrame:
    """``df`` with each configuration twice where it has ``error_recalibrated`` (the same real runs
    against a second calibration's prediction): once with each error in column ``error``; with
    ``relative``, each column's errors less that calibration's shift (:func:`less_shift`)."""
    def rel(col: pd.Series) -> pd.Series:
        return less_shift(col) if relative and col.notna().any() else col

    df = df.assign(error=rel(df["error"]))
    if "error_recalibrated" not in df or df["error_recalibrated"].dropna().empty:
        return df
    again = df.dropna(subset=["error_recalibrated"]).assign(error=lambda d: rel(d["error_recalibrated"]))
    return pd.concat([df, again], ignore_index=True)


def ranges_from_accuracy(results: pd.DataFrame | str, *,
                         relative: bool = False) -> dict[str, tuple[float, float]]:
    """Per method, the signed range ``(lo, hi)`` of ``(simulated - measured) / measured`` over a
    ``reproductions/sim_accuracy`` results table (columns ``method``, ``error`` and, when present,
    ``measured_spread``), and ``"ALL"``, the union: a measured ``margin`` for
    :func:`pipelab.planner.plan`. Each configuration's error is widened by the spread of its real
    rounds, ``(max - min) / median`` taken as ``median x (1 +- spread / 2)`` (at most +-90%). Where
    the table has ``error_recalibrated`` (the same runs against a second calibration's prediction), a
    configuration's range covers both errors: a user calibrates once, and one calibration's
    predictions lie several percent from the next's on a shared machine. With ``relative``, each
    error is taken less its calibration's common shift first (:func:`less_shift`): the range a
    comparison of two predictions of one calibration needs (:func:`load_margin`)."""
    df = pd.read_csv(results) if isinstance(results, str) else results
    if "error" not in df or "method" not in df or df["error"].dropna().empty:
        raise ValueError("ranges_from_accuracy needs sim_accuracy's results with columns 'method' and "
                         "'error' (reproductions/sim_accuracy/results.csv)")
    df = _both_calibrations(df, relative).dropna(subset=["error"])
    half = (df["measured_spread"].fillna(0.0).clip(lower=0.0) / 2).clip(upper=0.9) \
        if "measured_spread" in df else pd.Series(0.0, index=df.index)
    lo = (1 + df["error"]) / (1 + half) - 1
    hi = (1 + df["error"]) / (1 - half) - 1
    out = {str(m): (float(lo[part.index].min()), float(hi[part.index].max()))
           for m, part in df.groupby("method")}
    out["ALL"] = (float(lo.min()), float(hi.max()))
    return out


def load_margin(path: str | Path) -> dict[str, tuple[float, float]]:
    """The margin an errors file of :func:`write_errors` gives the planner: per method, the signed
    ranges of its errors less each run's common shift (``load_ranges(path, relative=True)``)."""
    return load_ranges(path, relative=True)


def resolve_margin(margin: Margin | str | Path | None) -> tuple[Margin, str]:
    """``(margin, where it came from)`` of what :func:`pipelab.planner.plan` was given: ``None`` is 0
    with :data:`NO_MARGIN`; a path is an errors file of :func:`write_errors` (:func:`load_margin`), or a
    sim_accuracy ``results.csv`` (:func:`ranges_from_accuracy`, relative); a number or a mapping is
    checked as it is (:func:`check_margin`)."""
    if margin is None:
        return 0.0, NO_MARGIN
    if isinstance(margin, (str, Path)):
        path = Path(margin)
        if not path.is_file():
            raise ValueError(f"margin={str(margin)!r}: no such file; pass the sim_errors.json (or "
                             "results.csv) that reproductions/sim_accuracy wrote on this machine, or a "
                             "number")
        if path.suffix == ".csv":
            got: Margin = check_margin(ranges_from_accuracy(str(path), relative=True))
        else:
            got = load_margin(path)
        return got, f"measured: {path}"
    got = check_margin(margin)
    return got, "given"


__all__ = ["NO_MARGIN", "ONE_STAGE_ASYNC", "ONE_STAGE_SYNC", "bounds_of", "check_margin", "decide",
           "error_of", "held_out", "less_shift", "load_errors", "load_margin", "load_ranges",
           "margin_from_accuracy", "ranges_from_accuracy", "resolve_margin", "write_errors"]
