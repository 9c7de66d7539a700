"""The planner's decision: which row of a ranked table replaces the default, given the simulator's error.

A method's signed error range ``[lo, hi]`` of ``(predicted - measured) / measured`` turns a prediction
``p`` into the interval ``[p / (1 + hi), p / (1 + lo)]`` of measured throughput. A candidate replaces
the default only when its interval lies above the default's; among those, the ones tied with the fastest
within the error go to the simplest plan (:func:`_simpler`). ``margin`` is measured on the machine the
plans are for (:func:`load_margin`); ``margin = 0`` picks the fastest. docs/planner.md has the details.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

import pipelab.methods as registry

#: what the planner says when it was given no margin (:func:`resolve_margin`)
NO_MARGIN = ("no simulator error given (margin=None): ranked by prediction alone. Measure the simulator "
             "on this machine (reproductions/sim_accuracy writes sim_errors.json) and pass margin= that "
             "file, or a relative error such as 0.2")


def _read(path: str | Path, values: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """``values(doc)`` of an errors file (reproductions/sim_accuracy/errors_file.py), checked as a margin."""
    try:
        out = values(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise ValueError(f"{path}: not a simulator-error file ({e}); rewrite it with "
                         "`pipelab reproduce --only sim_accuracy`") from e
    check_margin(out)
    return out


def load_ranges(path: str | Path, *, relative: bool = False) -> dict[str, tuple[float, float]]:
    """Per-method signed error ranges of an errors file; ``relative``: less each run's common shift."""
    def ranges(doc: dict[str, Any]) -> dict[str, tuple[float, float]]:
        raw = ((doc.get("relative_ranges") if relative else None) or doc.get("ranges")
               or {k: (-float(v), float(v)) for k, v in doc["errors"].items()})
        return {str(k): (float(v[0]), float(v[1])) for k, v in raw.items()}
    return _read(path, ranges)


def load_errors(path: str | Path) -> dict[str, float]:
    """The per-method errors of an errors file (``{"errors": {method: error}}``)."""
    return _read(path, lambda doc: {str(k): float(v) for k, v in doc["errors"].items()})


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
    """``margin`` checked: an error in ``[0, 1)``, or a mapping method -> such or -> ``(lo, hi)``."""
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
    """The signed error range ``margin`` gives a row of ``method`` (``dp``'s where the row is data
    parallelism; ``"ALL"``'s, else the widest, for a method it does not name)."""
    if not isinstance(margin, Mapping):
        return _as_range(float(margin))
    key = "dp" if equivalent else method
    if key in margin:
        return _as_range(margin[key])
    if "ALL" in margin:
        return _as_range(margin["ALL"])
    ranges = [_as_range(v) for v in margin.values()]
    return min(lo for lo, _ in ranges), max(hi for _, hi in ranges)


def _simpler(table: pd.DataFrame, i: Any) -> tuple[Any, ...]:
    """How complex row ``i``'s plan is, for ties: asynchronous, stages, not data parallelism, chunks,
    recomputation, compression, microbatches, peak memory, then table order (smaller is simpler)."""
    r = table.loc[i]
    return (not bool(r["synchronous"]), int(r["stages"]), registry.get(str(r["method"])).order != "dp",
            int(r["chunks"]), bool(r["recompute"]), r["compression"] != "none", int(r["microbatches"]),
            float(r["peak_memory"]), i)


def decide(table: pd.DataFrame, default: int | None, margin: Margin) -> pd.DataFrame:
    """Columns ``vs_default``, ``needs_vs_default`` (``(1 + hi) / (1 + lo_default)``), ``within_error``
    and ``pick`` of a ranked table (module docstring); the same pick whatever the row order."""
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
    """Per method and ``"ALL"``, the worst |error| of a ``reproductions/sim_accuracy`` results table."""
    df = _both_calibrations(_results(results, "margin_from_accuracy"))
    worst = df.dropna(subset=["error"]).assign(e=lambda d: d["error"].abs()).groupby("method")["e"].max()
    return {**{str(k): float(v) for k, v in worst.items()}, "ALL": float(worst.max())}


def _results(results: pd.DataFrame | str, who: str) -> pd.DataFrame:
    """A sim_accuracy results table (or its path), checked for columns ``method`` and ``error``."""
    df = pd.read_csv(results) if isinstance(results, str) else results
    if "error" not in df or "method" not in df or df["error"].dropna().empty:
        raise ValueError(f"{who} needs sim_accuracy's results with columns 'method' and 'error' "
                         "(reproductions/sim_accuracy/results.csv)")
    return df


def less_shift(errors: pd.Series) -> pd.Series:
    """Signed errors relative to their median, ``(1 + e) / (1 + median) - 1``: a shift common to one
    run's errors cancels when two predictions of one calibration are compared (docs/planner.md)."""
    return (1 + errors) / (1 + float(errors.median())) - 1


def _both_calibrations(df: pd.DataFrame, relative: bool = False) -> pd.DataFrame:
    """``df`` with each configuration again for ``error_recalibrated`` where present (``relative``:
    each calibration's errors less its shift)."""
    def rel(col: pd.Series) -> pd.Series:
        return less_shift(col) if relative and col.notna().any() else col

    df = df.assign(error=rel(df["error"]))
    if "error_recalibrated" not in df or df["error_recalibrated"].dropna().empty:
        return df
    again = df.dropna(subset=["error_recalibrated"]).assign(error=lambda d: rel(d["error_recalibrated"]))
    return pd.concat([df, again], ignore_index=True)


def ranges_from_accuracy(results: pd.DataFrame | str, *,
                         relative: bool = False) -> dict[str, tuple[float, float]]:
    """Per method and ``"ALL"``, the signed error range over a sim_accuracy results table, each error
    widened by half its runs' spread (at most 90%) and covering both calibrations (``relative``: each
    less its shift, :func:`less_shift`)."""
    df = _results(results, "ranges_from_accuracy")
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
    """The planner's margin from an errors file: ``load_ranges(path, relative=True)``."""
    return load_ranges(path, relative=True)


def resolve_margin(margin: Margin | str | Path | None) -> tuple[Margin, str]:
    """``(margin, its source)``: None is 0 (:data:`NO_MARGIN`); a path an errors file or a sim_accuracy
    ``results.csv``; a number or mapping is checked."""
    if margin is None:
        return 0.0, NO_MARGIN
    if isinstance(margin, (str, Path)):
        path = Path(margin)
        if not path.is_file():
            raise ValueError(f"margin={str(margin)!r}: no such file; pass the sim_errors.json (or "
                             "results.csv) that reproductions/sim_accuracy wrote on this machine, or a "
                             "number")
        got = check_margin(ranges_from_accuracy(str(path), relative=True)) if path.suffix == ".csv" \
            else load_margin(path)
        return got, f"measured: {path}"
    return check_margin(margin), "given"
