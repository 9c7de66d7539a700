"""The planner's errors file (``sim_errors.json``) a sim_accuracy run writes: per method the worst error
and the signed ranges, pooled over the host's last runs, each run checked held out against those before it.

``pipelab.planner.decide.load_margin`` reads it back (``pl.plan(..., margin=path)``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from pipelab._io import atomic_write_text
from pipelab.planner.decide import (
    Margin,
    _both_calibrations,
    _results,
    bounds_of,
    check_margin,
    margin_from_accuracy,
    ranges_from_accuracy,
)


def write_errors(results: pd.DataFrame | str, path: str | Path, *,
                 source: str = "", host: str | None = None, history: int = 5) -> dict[str, float]:
    """Write a sim_accuracy table's per-method errors and signed ranges (absolute and ``relative``),
    rounded outwards to 0.01, to ``path`` atomically; return the errors.

    With ``host``, the file keeps that host's last ``history`` runs and holds their union (a file of
    another host starts anew)."""
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


def held_out(results: pd.DataFrame | str, margin: Margin) -> pd.DataFrame:
    """Per configuration of a sim_accuracy run: ``method``, ``error`` less the run's shift, the margin's
    ``lo`` and ``hi``, and ``inside`` (with a margin of earlier runs: its held-out coverage)."""
    df = _results(results, "held_out")
    margin = check_margin(margin)
    df = _both_calibrations(df, relative=True).dropna(subset=["error"])
    bounds = [bounds_of(margin, str(m)) for m in df["method"]]
    out = pd.DataFrame({"method": df["method"].astype(str).to_numpy(), "error": df["error"].to_numpy(),
                        "lo": [lo for lo, _ in bounds], "hi": [hi for _, hi in bounds]})
    out["inside"] = (out["lo"] <= out["error"]) & (out["error"] <= out["hi"])
    return out
