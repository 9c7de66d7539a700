"""The weight-stashing experiment over several seeds: each method's late accuracy with its spread.

The notebook (``weight_stashing.ipynb``, run by ``make reproduce``) trains two seeds; this script runs
the same ``stashing.stash_experiment`` (same model, data, learning rate, epochs, backend) over
more seeds, so that the spread a rerun on another machine can land in is known. Runs are independent
per seed: ``--seeds 0 1 2`` in one process and ``--seeds 3 4`` in another give the same rows.

Run: ``python reproductions/weight_stashing/seeds.py --seeds 0 1 2 3 4 --out seeds.csv`` (about 20 s per
method and seed on one CPU thread); ``--summarize a.csv b.csv --out seeds_summary.csv`` merges per-seed
files into mean, standard deviation, min and max per method.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

import pandas as pd

from reproductions._common import report as output
from reproductions.weight_stashing import stashing

METHODS = ["dp", "pipedream", "pipedream+vertical_sync", "naive-async", "2bw", "pipemare"]


def per_seed(methods: list[str], seeds: list[int]) -> pd.DataFrame:
    """One row per method and seed: final and late accuracy (mean of the last 3 epochs), late gap to dp."""
    import torch

    rows = []
    for seed in seeds:
        curves = stashing.stash_experiment(methods, stages=4, epochs=8, batch_size=32, lr=0.2, momentum=0.0,
                                     channels=16, backend="local", seed=seed, progress=False)
        summary = stashing.stash_summary(curves)
        for _, r in summary.iterrows():
            rows.append({"method": r["method"], "seed": seed, "final_accuracy": r["final_accuracy"],
                         "late_accuracy": r["late_accuracy"], "late_gap_to_dp_pts": r["late_gap_to_dp_pts"],
                         "torch_threads": torch.get_num_threads(),
                         "cpu": platform.processor() or platform.machine(),
                         "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "")})
        print(f"seed {seed} done", file=sys.stderr)
    return pd.DataFrame(rows)


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per method over seeds: mean, standard deviation, min and max of late accuracy and gap to dp."""
    order = list(dict.fromkeys(df["method"]))
    g = df.groupby("method")
    out = pd.DataFrame({
        "seeds": g["seed"].nunique(),
        "late_accuracy_mean": g["late_accuracy"].mean().round(4),
        "late_accuracy_sd": g["late_accuracy"].std(ddof=1).round(4),
        "late_accuracy_min": g["late_accuracy"].min(),
        "late_accuracy_max": g["late_accuracy"].max(),
        "gap_to_dp_pts_mean": g["late_gap_to_dp_pts"].mean().round(2),
        "gap_to_dp_pts_sd": g["late_gap_to_dp_pts"].std(ddof=1).round(2),
        "gap_to_dp_pts_min": g["late_gap_to_dp_pts"].min(),
        "gap_to_dp_pts_max": g["late_gap_to_dp_pts"].max(),
    }).loc[order]
    return out.reset_index()


def main(argv: list[str] | None = None) -> int:
    """Command line: run seeds, or summarize per-seed files."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    p.add_argument("--methods", nargs="*", default=METHODS)
    p.add_argument("--summarize", nargs="*", default=None, help="per-seed CSVs to merge and summarize")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.summarize:
        df = pd.concat([pd.read_csv(f) for f in args.summarize], ignore_index=True)
        df = df.sort_values(["seed"], kind="stable")
        output.write_table(df, Path(args.out).with_name("seeds.csv"))
        output.write_table(summarize(df), args.out)
    else:
        output.write_table(per_seed(args.methods, args.seeds), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
