"""Read the grid's cells: per-cell summary over seeds, heatmaps, verdicts and time to accuracy.

Usage: ``.venv/bin/python reproductions/convergence/report.py [cells.csv ...] [--tta cells_tta.csv ...]
[--out DIR]`` (default: the grid's ``cells*.csv`` beside this file, the subsets' left out, and
``cells_tta.csv`` for the time to accuracy). Writes ``summary.csv``,
``heatmap_<task>.svg``, ``stable_ranges.csv``, ``time_to_accuracy.csv`` and ``results.md`` into
``DIR`` (default: beside this file).

* **Heatmap**: final test accuracy (mean over seeds, and its spread max - min) per method x step size,
  one panel per pipeline depth P. ``dp`` runs at the smallest depth only and stands for every depth
  (minibatch SGD does not depend on P).
* **Stable range**: step sizes where a method ends within ``TOL_PTS`` points of ``dp`` at the same
  step size (mean over seeds).
* **Time to accuracy** (PipeDream's "up to 5.3x faster", SOSP'19 Table 1): the product of the
  simulated epoch-time speed-up of PipeDream over DP on each Table 1 row
  (``../pipedream_table1/results.csv``) and the measured statistical-efficiency ratio
  ``epochs DP needs / epochs the method needs`` to reach test accuracy ``TTA_TARGET``, at the grid
  depth nearest the row's stage count, per seed, from the time-to-accuracy runs (``grid.py --tta``).
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))   # the checkout's root, for reproductions._common

from reproductions._common.report import write_rows  # noqa: E402

TOL_PTS = 2.0
#: test accuracy the time-to-accuracy runs (grid.py --tta) must reach (shapes: chance 0.25, a linear
#: classifier 0.585)
TTA_TARGET = 0.6
#: depths a Table 1 row's stage count maps to (the nearest; a row whose depth was not run is left out)
GRID_DEPTHS = (2, 4, 8)
LABELS = {"pipemare-T1": "pipemare without T1", "pipemare-T2": "pipemare without T2",
          "pipemare-K25": "pipemare, K = run/4", "pipemare-K25-Dtau": "pipemare, K = run/4, γ = 0.1^(1/τ)"}


def load(paths: list[Path]) -> list[dict[str, Any]]:
    """Every cell row, typed."""
    rows = []
    seen: set[tuple[str, ...]] = set()
    for p in paths:
        with p.open() as f:
            for r in csv.DictReader(f):
                key = (r["task"], r["stages"], r["method"], r["lr"], r["seed"])
                if key in seen:       # a cell run by two grid processes: the first row counts
                    continue
                seen.add(key)
                rows.append({**r, "stages": int(r["stages"]), "lr": float(r["lr"]), "seed": int(r["seed"]),
                             "final_accuracy": float(r["final_accuracy"]),
                             "curve": [float(v) for v in r["accuracy_per_epoch"].split()],
                             "diverged": int(r["diverged"])})
    return rows


def cells(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str, float], list[dict[str, Any]]]:
    """(task, P, method, lr) -> its rows (one per seed); dp's rows stand for every depth."""
    out: dict[tuple[str, int, str, float], list[dict[str, Any]]] = defaultdict(list)
    depths = sorted({r["stages"] for r in rows})
    dp_seen: set[tuple[str, float, int]] = set()
    for r in sorted(rows, key=lambda r: r["stages"]):
        if r["method"] == "dp":           # one dp run per (task, step size, seed): the smallest depth's
            if (r["task"], r["lr"], r["seed"]) in dp_seen:
                continue
            dp_seen.add((r["task"], r["lr"], r["seed"]))
        for P in (depths if r["method"] == "dp" else [r["stages"]]):
            out[(r["task"], P, r["method"], r["lr"])].append(r)
    return out


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell: mean, sd, min, max of the final accuracy over seeds; diverged seeds."""
    out = []
    for (task, P, m, lr), rs in sorted(cells(rows).items()):
        acc = [r["final_accuracy"] for r in rs]
        out.append({"task": task, "stages": P, "method": m, "lr": lr, "seeds": len(rs),
                    "accuracy_mean": round(statistics.mean(acc), 4),
                    "accuracy_sd": round(statistics.stdev(acc), 4) if len(acc) > 1 else 0.0,
                    "accuracy_min": min(acc), "accuracy_max": max(acc),
                    "diverged_seeds": sum(r["diverged"] for r in rs)})
    return out


def _color(a: float, lo: float, hi: float) -> str:
    x = 0.0 if hi <= lo else max(0.0, min(1.0, (a - lo) / (hi - lo)))
    r, g, b = int(220 - 180 * x), int(60 + 150 * x), int(60 + 40 * x)
    return f"rgb({r},{g},{b})"


def heatmap_svg(summary: list[dict[str, Any]], task: str, methods: list[str], chance: float) -> str:
    """Panels per depth, rows methods, columns step sizes; 'mean (spread)' in each cell."""
    rows = [r for r in summary if r["task"] == task]
    depths = sorted({r["stages"] for r in rows})
    lrs = sorted({r["lr"] for r in rows})
    hi = max((r["accuracy_mean"] for r in rows), default=1.0)
    cw, ch, left, top, gap = 74, 22, 170, 40, 30
    pw = len(lrs) * cw
    W = left + len(depths) * (pw + gap)
    H = top + len(methods) * ch + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           f'font-size="11"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="4" y="14" font-size="13">{task}: final test accuracy, mean over seeds (max - min); '
           f'colour from chance {chance:.2f} to the best mean {hi:.3f}</text>']
    for k, P in enumerate(depths):
        x0 = left + k * (pw + gap)
        out.append(f'<text x="{x0 + pw / 2}" y="{top - 16}" text-anchor="middle">P = {P}</text>')
        for j, lr in enumerate(lrs):
            out.append(f'<text x="{x0 + j * cw + cw / 2}" y="{top - 3}" '
                       f'text-anchor="middle">lr {lr:g}</text>')
        for i, m in enumerate(methods):
            if k == 0:
                out.append(f'<text x="{left - 6}" y="{top + i * ch + 15}" text-anchor="end">'
                           f'{LABELS.get(m, m)}</text>')
            for j, lr in enumerate(lrs):
                c = next((r for r in rows if r["stages"] == P and r["method"] == m and r["lr"] == lr), None)
                x, y = x0 + j * cw, top + i * ch
                if c is None:
                    out.append(f'<rect x="{x}" y="{y}" width="{cw - 2}" height="{ch - 2}" fill="#eee"/>')
                    continue
                spread = c["accuracy_max"] - c["accuracy_min"]
                out.append(f'<rect x="{x}" y="{y}" width="{cw - 2}" height="{ch - 2}" '
                           f'fill="{_color(c["accuracy_mean"], chance, hi)}"/>')
                out.append(f'<text x="{x + cw / 2 - 1}" y="{y + 14}" text-anchor="middle">'
                           f'{c["accuracy_mean"]:.2f} ({spread:.2f})</text>')
    out.append(f'<text x="4" y="{H - 10}">grey: not run. n seeds per cell in summary.csv</text></svg>')
    return "\n".join(out)


def markdown_tables(summary: list[dict[str, Any]], methods: list[str]) -> str:
    """Per task and depth: method x step size, 'mean (min-max)'."""
    lines = []
    for task in sorted({r["task"] for r in summary}):
        for P in sorted({r["stages"] for r in summary if r["task"] == task}):
            rs = [r for r in summary if r["task"] == task and r["stages"] == P]
            lrs = sorted({r["lr"] for r in rs})
            lines += [f"\n**{task}, P = {P}** (final accuracy, mean over seeds (min-max); n = seeds)\n",
                      "| method | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |",
                      "|---|" + "---|" * len(lrs)]
            for m in methods:
                cellz = []
                for lr in lrs:
                    c = next((r for r in rs if r["method"] == m and r["lr"] == lr), None)
                    cellz.append("" if c is None else f"{c['accuracy_mean']:.3f} ({c['accuracy_min']:.3f}-"
                                 f"{c['accuracy_max']:.3f}) n={c['seeds']}")
                lines.append(f"| {LABELS.get(m, m)} | " + " | ".join(cellz) + " |")
    return "\n".join(lines)


def stable_ranges(summary: list[dict[str, Any]], methods: list[str]) -> list[dict[str, Any]]:
    """Per task, depth and method: the step sizes where it ends within TOL_PTS of dp (same step size)."""
    out = []
    for task in sorted({r["task"] for r in summary}):
        for P in sorted({r["stages"] for r in summary if r["task"] == task}):
            rs = {(r["method"], r["lr"]): r for r in summary if r["task"] == task and r["stages"] == P}
            lrs = sorted({lr for _, lr in rs})
            for m in methods:
                ok = [lr for lr in lrs if (m, lr) in rs and ("dp", lr) in rs
                      and (rs[(m, lr)]["accuracy_mean"] - rs[("dp", lr)]["accuracy_mean"]) * 100 >= -TOL_PTS]
                ran = [lr for lr in lrs if (m, lr) in rs]
                out.append({"task": task, "stages": P, "method": m, "lrs_run": len(ran),
                            "lrs_within_tol_of_dp": " ".join(f"{lr:g}" for lr in ok), "n_within": len(ok)})
    return out


def epochs_to(curve: list[float], target: float, chance: float = 0.25) -> float:
    """Epochs (from 1) until the accuracy first reaches ``target``, linearly interpolated between the
    epoch before (epoch 0: ``chance``) and the first epoch at or above it; inf if none does."""
    prev, at = chance, 0.0
    for i, a in enumerate(curve):
        if a >= target:
            return at + (i + 1 - at) * (target - prev) / (a - prev) if a > prev else float(i + 1)
        prev, at = a, float(i + 1)
    return math.inf


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def time_to_accuracy(rows: list[dict[str, Any]], table1: Path, target: float = TTA_TARGET
                     ) -> list[dict[str, Any]]:
    """Per Table 1 row, task and pipelined method: simulated speed-up x statistical efficiency.

    Statistical efficiency is ``epochs DP needs / epochs the method needs`` to reach test accuracy
    ``target``, per seed, at the grid depth nearest the row's stage count; DP at the step size where it
    gets there soonest (median over seeds), the method at DP's step size and at its own soonest. A seed
    on which the method never gets there counts 0; one on which DP never does is left out."""
    if not table1.exists():
        return []
    with table1.open() as f:
        t1 = list(csv.DictReader(f))
    out = []
    grid = cells(rows)

    def soonest(rs_by_lr: dict[float, list[dict[str, Any]]]) -> float:
        return min(rs_by_lr, key=lambda lr: (_med([epochs_to(r["curve"], target) for r in rs_by_lr[lr]]),
                                             -_med([r["final_accuracy"] for r in rs_by_lr[lr]])))

    for task in sorted({r["task"] for r in rows}):
        dp_by_lr = {lr: rs for (t, P, m, lr), rs in grid.items() if t == task and m == "dp"}
        if not dp_by_lr:
            continue
        dp_lr = soonest(dp_by_lr)
        dp_epochs = {r["seed"]: epochs_to(r["curve"], target) for r in dp_by_lr[dp_lr]}
        depths = sorted({P for (t, P, _, _) in grid if t == task})
        methods = sorted({m for (t, _, m, _) in grid if t == task and m != "dp"})
        for row in t1:
            stages = int(row["stages"])
            hw = float(row["simulated_speedup"])
            P = 1 if stages <= 1 else min(GRID_DEPTHS, key=lambda d: (abs(d - stages), -d))
            if stages > 1 and P not in depths:      # e.g. make reproduce's subset runs P = 2 only
                continue
            for method in (["dp"] if stages <= 1 else methods):
                own = {lr: rs for (t, P_, m, lr), rs in grid.items() if t == task and P_ == P and m == method}
                for which in ("dp_step_size", "own_best_step_size"):
                    if stages <= 1:
                        lr, ratios, reached = dp_lr, [1.0], 1
                    else:
                        lr = dp_lr if which == "dp_step_size" else (soonest(own) if own else dp_lr)
                        m_rows = [r for r in own.get(lr, [])
                                  if math.isfinite(dp_epochs.get(r["seed"], math.inf))]
                        ratios = [dp_epochs[r["seed"]] / epochs_to(r["curve"], target) for r in m_rows]
                        reached = sum(math.isfinite(epochs_to(r["curve"], target)) for r in m_rows)
                    if not ratios:
                        continue
                    prod = [hw * x for x in ratios]
                    out.append({"task": task, "model": row["model"], "cluster": row["cluster"],
                                "servers_x_gpus": row["servers_x_gpus"], "config": row["config"],
                                "stages": stages, "grid_depth": P, "method": method, "step_size": which,
                                "lr": lr, "dp_lr": dp_lr, "target_accuracy": target,
                                "dp_epochs_median": round(_med([v for v in dp_epochs.values()
                                                                if math.isfinite(v)]), 2),
                                "simulated_speedup": hw,
                                "stat_efficiency_median": round(_med(ratios), 3),
                                "stat_efficiency_min": round(min(ratios), 3),
                                "stat_efficiency_max": round(max(ratios), 3),
                                "time_to_accuracy_speedup_median": round(_med(prod), 3),
                                "time_to_accuracy_speedup_min": round(min(prod), 3),
                                "time_to_accuracy_speedup_max": round(max(prod), 3), "seeds": len(ratios),
                                "seeds_reaching_target": reached, "paper_speedup": row["paper_speedup"],
                                "commits": " ".join(sorted({r["commit"] for r in rows
                                                            if r["task"] == task}))})
                    if stages <= 1:
                        break
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cells", nargs="*", type=Path)
    ap.add_argument("--tta", nargs="*", type=Path, default=None,
                    help="time-to-accuracy cells (default: cells_tta.csv beside this file, if there)")
    ap.add_argument("--out", type=Path, default=HERE)
    a = ap.parse_args(argv)
    out_dir = a.out
    out_dir.mkdir(parents=True, exist_ok=True)
    given = list(a.cells)
    found = sorted(HERE.glob("cells*.csv"))
    tta_default = [p for p in found if p.name == "cells_tta.csv"] if not given else []
    tta_paths = list(a.tta) if a.tta is not None else tta_default
    grid_found = [p for p in found if not p.name.startswith(("cells_subset", "cells_tta"))]
    paths = [p for p in (given or grid_found) if p not in tta_paths]
    rows = load(paths) if paths else []
    from grid import METHODS

    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    summary = summarize(rows)
    if summary:
        write_rows(out_dir / "summary.csv", summary)
    for task, chance in (("shapes", 0.25), ("chars", 0.332)):
        if any(r["task"] == task for r in summary):
            (out_dir / f"heatmap_{task}.svg").write_text(heatmap_svg(summary, task, methods, chance))
    stable = stable_ranges(summary, methods)
    if stable:
        write_rows(out_dir / "stable_ranges.csv", stable)
    tta_rows = load(tta_paths) if tta_paths else []
    tta = time_to_accuracy(tta_rows, HERE.parent / "pipedream_table1" / "results.csv")
    if tta:
        write_rows(out_dir / "time_to_accuracy.csv", tta)
    commits = sorted({r["commit"] for r in rows})
    md = ["# Convergence grid: results", "",
          f"Cells from {', '.join(p.name for p in paths)}; made at commit(s) {', '.join(commits)}.",
          markdown_tables(summary, methods), "",
          f"## Step sizes within {TOL_PTS:g} points of dp", "",
          "| task | P | method | step sizes within tolerance | of |", "|---|---|---|---|---|"]
    md += [f"| {r['task']} | {r['stages']} | {LABELS.get(r['method'], r['method'])} | "
           f"{r['lrs_within_tol_of_dp'] or '-'} | {r['lrs_run']} |" for r in stable]
    if tta:
        tc = sorted({c for r in tta for c in r["commits"].split()})
        md += ["", "## Time to accuracy = simulated epoch-time speed-up x statistical efficiency", "",
               f"Cells from {', '.join(p.name for p in tta_paths)}; made at commit(s) {', '.join(tc)}. "
               f"Target: test accuracy {TTA_TARGET:g}; epochs to it interpolated between evaluations; "
               "DP at the step size where it gets there soonest; a seed whose DP run never gets there is "
               "left out, a seed on which the method never does counts 0.", "",
               "| task | model | cluster | config | grid P | method | lr | seeds reaching | simulated × "
               "| epochs DP / method, median (min-max) | product ×, median (min-max) | paper × |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['task']} | {r['model']} | {r['cluster']} {r['servers_x_gpus']} | {r['config']} | "
               f"{r['grid_depth']} | {LABELS.get(r['method'], r['method'])} | {r['lr']:g} "
               f"({r['step_size'].replace('_', ' ')}) | "
               f"{r['seeds_reaching_target']}/{r['seeds']} | {r['simulated_speedup']:.2f} | "
               f"{r['stat_efficiency_median']:.2f} "
               f"({r['stat_efficiency_min']:.2f}-{r['stat_efficiency_max']:.2f}) | "
               f"{r['time_to_accuracy_speedup_median']:.2f} ({r['time_to_accuracy_speedup_min']:.2f}-"
               f"{r['time_to_accuracy_speedup_max']:.2f}) | {r['paper_speedup']} |" for r in tta]
    (out_dir / "results.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
