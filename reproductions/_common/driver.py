"""``pipelab reproduce``: run every reproduction notebook under papermill and write its results.

A run writes into a run folder of its own, ``reproductions/runs/<UTC time>/`` (git ignores it), and
prints how its tables compare with the committed references in ``reproductions/<part>/``; a checkout
stays clean. ``--update-references`` is the one way to rewrite the committed references (it runs
the full grids). At the defaults the grids that do not fit the time budget run a stated subset
(:data:`SUBSET`); ``--full`` runs them whole.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelab._io import atomic_write_text

if TYPE_CHECKING:
    import pandas as pd


from pipelab.cli.profile import show
from pipelab.models import example, pipedream_profile
from pipelab.profile.measure import profile
from reproductions._common.compare import compare_folder
from reproductions._common.report import build_report, markdown_table, run_notebook, write_table
from reproductions.pipedream_table1.paper import (
    alternatives,
    alternatives_markdown,
    sensitivity,
    sensitivity_markdown,
    sensitivity_svg,
)
from reproductions.pipedream_table1.rows import TABLE1, PaperRow, table1_markdown

#: the repository's reproductions/ folder
REPRODUCTIONS = Path(__file__).resolve().parents[1]
#: where runs go, one folder each (ignored by git: reproductions/.gitignore)
RUNS = REPRODUCTIONS / "runs"
#: the parameters that make a part's stated subset at the defaults (``--full`` and
#: ``--update-references`` drop them); what each leaves out is in reproductions/README.md
SUBSET: dict[str, dict[str, Any]] = {
    "weight_stashing": {"sweep_lrs": []},       # the learning-rate sweep (3 lrs x 3 methods), ~1.3 min
    "weight_buffer": {"lrs": [0.02]},           # the second learning rate (0.04), ~1.9 min
}


def quickstart(*, image_size: int = 64, batch: int = 4, repeats: int = 3, device: str = "cpu",
               progress: bool = True) -> int:
    """Profile VGG-16 (no weights needed) and print its table and PipeDream's; returns 0."""

    model, sample = example("vgg16", batch, image_size=image_size)
    prof = profile(model, sample, device=device, repeats=repeats, progress=progress, model_name="vgg16")
    print(f"== VGG-16 measured here: batch {batch}, {image_size}x{image_size} images, {device} ==")
    show(prof)
    ref = pipedream_profile("vgg16")
    print(f"\n== PipeDream's VGG-16 profile (shipped; batch {ref.batch_size}, 224x224, V100) ==")
    print(repr(ref))
    here = prof.totals(0, len(prof))
    print(
        f"\nbackward/forward time ratio: here {here.bwd_s / here.fwd_s:.2f}, "
        f"PipeDream {ref.bwd_s / ref.fwd_s:.2f}; parameters {prof.param_bytes / 4:,.0f} (expected "
        "138,357,544)"
    )
    return 0


def convergence_subset(out: Path) -> list[str]:
    """Run the convergence grid's stated subset (``grid.py`` at its defaults) and its report into ``out``.

    Returns the failures, one line each (the full grid is ``grid.py --full``, see its README)."""
    out.mkdir(parents=True, exist_ok=True)
    here = REPRODUCTIONS / "convergence"
    steps = ((here / "grid.py", "--out", str(out / "cells_subset.csv")),
             (here / "grid.py", "--tta-subset", "--out", str(out / "cells_tta_subset.csv")),
             (here / "report.py", str(out / "cells_subset.csv"), "--tta", str(out / "cells_tta_subset.csv"),
              "--out", str(out)))
    for script, *args in steps:
        done = subprocess.run([sys.executable, str(script), *args], check=False)
        if done.returncode:
            return [f"convergence: {script.name} exited {done.returncode}"]
    return []


@dataclass(frozen=True)
class Job:
    """One papermill run: a notebook, its parameters, and where its results go."""

    name: str
    notebook: Path
    parameters: dict[str, Any]
    out_dir: Path


def table1_jobs(out_dir: Path, *, rows: Sequence[PaperRow] = TABLE1, minibatches: int = 64,
                extra: Mapping[str, Any] | None = None) -> list[Job]:
    """One simulate-mode job per Table 1 row."""
    nb = REPRODUCTIONS / "pipedream_table1" / "table1.ipynb"
    jobs = []
    for r in rows:
        params = {
            "model": r.model,
            "cluster": r.cluster,
            "servers": r.servers,
            "gpus_per_server": r.gpus_per_server,
            "mode": "simulate",
            "minibatches": minibatches,
            "report": True,
            **(extra or {}),
        }
        jobs.append(Job(r.key, nb, params, out_dir / "_runs" / r.key.replace("/", "_")))
    return jobs


def table1_results_md(folder: Path) -> str:
    """``results.md`` of the Table 1 folder from its ``results.csv`` and ``measure.csv`` (either may be
    missing)."""
    import pandas as pd

    md = ""
    if (folder / "results.csv").exists():
        table = pd.read_csv(folder / "results.csv")
        md += (
            "# PipeDream Table 1: paper vs pipelab (simulated)\n\n"
            "Speed-up over data parallelism on the same cluster; *predicted* by the partitioner, *simulated* "
            "by `pl.simulate` (the number compared with the paper). See README.md for why they differ.\n\n"
            + table1_markdown(table)
            + "\n"
        )
    if (folder / "sensitivity.csv").exists():
        md += ("\n## Sensitivity to the two unknowns\n\n"
               "Rows, of 10, where pipelab's choice has the paper's configuration shape and is within 25% "
               "of its speed-up (in brackets: rows where the paper's own configuration is within 25%), "
               "simulated over the V100's speed relative to the profiling GPU and NCCL's bus bandwidth "
               "over TCP (a multiple of the cited 0.75 GB/s at 10 Gbps and 1.7 GB/s at 25 Gbps); the cited "
               "defaults in bold (`sensitivity.svg`, `sensitivity.csv`).\n\n"
               + sensitivity_markdown(pd.read_csv(folder / "sensitivity.csv")))
    if (folder / "alternatives.csv").exists():
        md += ("\n## Cited alternatives to the defaults' terms\n\n"
               "The whole table under each cited alternative (`alternatives.csv`, "
               "`reproductions.pipedream_table1.paper.ALTERNATIVES`): rows of 10 where pipelab's choice "
               "has the paper's shape and is within 25% (in brackets: the paper's own configurations within "
               "25%), "
               "then each row's error and pipelab's choice.\n\n"
               + alternatives_markdown(pd.read_csv(folder / "alternatives.csv")))
    if (folder / "measure.csv").exists():
        m = pd.read_csv(folder / "measure.csv").iloc[0]
        md += ("\n## Measure mode: real processes on this machine (reduced model)\n\n"
               + markdown_table(pd.DataFrame({"": list(m.index), "value": list(m.values)})) + "\n")
    return md


def run_jobs(jobs: Sequence[Job], *, bar: Any, tmp: Path) -> list[tuple[Job, Path]]:
    """Run jobs in order, advancing ``bar``; returns each job with its executed notebook."""
    done = []
    for job in jobs:
        bar.set_postfix_str(job.name)
        job.out_dir.mkdir(parents=True, exist_ok=True)
        executed = tmp / (job.name.replace("/", "_") + ".ipynb")
        run_notebook(job.notebook, executed, {**job.parameters, "out_dir": str(job.out_dir)},
                     cwd=job.notebook.parent)
        done.append((job, executed))
        bar.update()
    return done


def collect_table1(done: Sequence[tuple[Job, Path]]) -> pd.DataFrame:
    """The rows the Table 1 jobs wrote, in job order."""
    import pandas as pd

    return pd.DataFrame([json.loads((job.out_dir / "row.json").read_text()) for job, _ in done])


#: reproductions that are scripts (the simulator and cost model only, seconds to a minute): part ->
#: (module, its arguments at --quick)
SCRIPTS: dict[str, tuple[str, list[str]]] = {
    "zero_bubble": ("reproductions.zero_bubble.zero_bubble", []),
    "llm_acceptance": ("reproductions.llm_acceptance.acceptance", ["--rows", "1.7B", "22B"]),
}


def run_scripts(parts: Sequence[str], out_of: Any, *, quick: bool) -> list[str]:
    """Run the script reproductions ``parts``, each writing its tables to ``out_of(part)``; the failures."""
    import importlib

    failures = []
    for part in parts:
        module, quick_args = SCRIPTS[part]
        print(f"\n{part}: python -m {module}")
        try:
            importlib.import_module(module).main(["--out", str(out_of(part)), *(quick_args if quick else [])])
        except (Exception, SystemExit) as exc:   # one failing part does not stop the others
            failures.append(f"{part}: {type(exc).__name__}: {exc}")
    return failures


def run_folder(now: datetime.datetime | None = None) -> Path:
    """A new folder under :data:`RUNS` named by the UTC time (``20261207-153000``, suffixed if taken)."""
    stamp = f"{(now or datetime.datetime.now(datetime.timezone.utc)):%Y%m%d-%H%M%S}"
    folder, n = RUNS / stamp, 1
    while folder.exists():
        n += 1
        folder = RUNS / f"{stamp}-{n}"
    return folder


def print_comparison(out_root: Path, parts: Sequence[str]) -> None:
    """Print, part by part, how the run's tables under ``out_root`` compare with the committed ones."""
    folders = {"table1": "pipedream_table1", "measure": "pipedream_table1"}
    seen = []
    for part in parts:
        name = folders.get(part, part)
        if name in seen or not (out_root / name).is_dir():
            continue
        seen.append(name)
        print(f"\n{name}: this run against the committed reference (reproductions/{name}/)")
        for line in compare_folder(out_root / name, REPRODUCTIONS / name):
            print("  " + line)
    errors = out_root / "sim_accuracy" / "sim_errors.json"
    if errors.is_file():
        print(f"\nthis machine's simulator errors, for `pipelab plan --margin`: {errors}")


def main(argv: Sequence[str] | None = None) -> int:
    """``pipelab reproduce``: run every reproduction notebook and print the Table 1 comparison."""
    import shutil

    import pandas as pd
    from tqdm.auto import tqdm

    p = argparse.ArgumentParser(prog="pipelab reproduce", description=(
        "Run the reproductions under reproductions/ (PipeDream Table 1, weight stashing, HetPipe, weight "
        "buffer, simulator accuracy with papermill; the Zero Bubble development set and the blind LLM "
        "acceptance as scripts), write their tables and reports, and print how they compare with the "
        "committed references."))
    p.add_argument("--only",
                   default="table1,measure,weight_stashing,hetpipe,weight_buffer,sim_accuracy,convergence,"
                   "zero_bubble,llm_acceptance",
                   help="comma-separated parts to run (default: all)")
    p.add_argument(
        "--quick", action="store_true", help="tiny sizes (seconds, for tests)"
    )
    p.add_argument("--out", default=None,
                   help="write results here (default: a new run folder, reproductions/runs/<UTC time>/)")
    p.add_argument("--update-references", action="store_true",
                   help="rewrite the committed reference results in reproductions/<part>/ (full grids; "
                   "commit what changed)")
    p.add_argument("--full", action="store_true",
                   help="full grids instead of the defaults' stated subset (weight stashing's learning-rate "
                   "sweep, weight buffer's second learning rate), and Table 1's sensitivity grid and cited "
                   "alternatives (300 simulated rows, about 4 minutes)")
    p.add_argument("--minibatches", type=int, default=64, help="simulated minibatches per Table 1 row")
    p.add_argument("--quickstart", action="store_true",
                   help="only profile VGG-16 on this CPU and print its table beside PipeDream's")
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.quickstart:
        try:
            return quickstart()
        except (ValueError, TypeError) as exc:
            print(f"pipelab reproduce: error: {exc}", file=sys.stderr)
            return 2
    if args.update_references and (args.quick or args.out):
        p.error("--update-references rewrites the committed results at full size: not with --quick or --out")
    parts = [s.strip() for s in args.only.split(",") if s.strip()]
    known = {"table1", "measure", "weight_stashing", "hetpipe", "weight_buffer", "sim_accuracy",
             "convergence", *SCRIPTS}
    if unknown := set(parts) - known:
        p.error(f"unknown part(s) {sorted(unknown)}; choose from {sorted(known)}")
    out_root = None if args.update_references else Path(args.out).resolve() if args.out else run_folder()
    if out_root is not None:
        out_root.mkdir(parents=True, exist_ok=True)
        print(f"pipelab reproduce: this run's results go to {out_root}")

    def out_of(part: str) -> Path:
        return (out_root / part) if out_root else REPRODUCTIONS / part

    quick = args.quick
    subset = not (quick or args.full or args.update_references)

    def at_defaults(part: str) -> dict[str, Any]:
        return dict(SUBSET.get(part, {})) if subset else {}
    jobs: dict[str, list[Job]] = {}
    t1 = out_of("pipedream_table1")
    if "table1" in parts:
        rows = TABLE1[:2] if quick else TABLE1
        jobs["table1"] = table1_jobs(t1, rows=rows, minibatches=12 if quick else args.minibatches,
                                     extra={"gantt_minibatches": 3} if quick else None)
    if "measure" in parts:
        mparams = {
            "model": "vgg16",
            "cluster": "pipedream-a",
            "servers": 4,
            "gpus_per_server": 4,
            "mode": "measure",
            "measure_workers": 2,
            "measure_steps": 32,
            "measure_rounds": 7,
            "report": True,
            "minibatches": 16,
        }
        if quick:
            mparams.update(
                measure_steps=3,
                measure_warmup=1,
                measure_batch=8,
                measure_width=0.0625,
                minibatches=8,
                gantt_minibatches=2,
                measure_rounds=1,
            )
        jobs["measure"] = [
            Job(
                "table1 measure mode",
                REPRODUCTIONS / "pipedream_table1" / "table1.ipynb",
                mparams,
                t1 / "_runs" / "measure",
            )
        ]
    if "weight_stashing" in parts:
        sparams: dict[str, Any] = {"report": True, **at_defaults("weight_stashing")}
        if quick:
            sparams.update(methods=["dp", "pipedream"], epochs=1, train_limit=128)
        jobs["weight_stashing"] = [
            Job(
                "weight stashing",
                REPRODUCTIONS / "weight_stashing" / "weight_stashing.ipynb",
                sparams,
                out_of("weight_stashing"),
            )
        ]
    if "hetpipe" in parts:
        hparams: dict[str, Any] = {"report": True}
        if quick:
            hparams.update(
                staleness=[0, 1], minibatches=12, emu_epochs=1, emu_train_limit=128, emu_staleness=[0]
            )
        jobs["hetpipe"] = [
            Job("hetpipe", REPRODUCTIONS / "hetpipe" / "hetpipe.ipynb", hparams, out_of("hetpipe"))
        ]
    buffer_nb = REPRODUCTIONS / "weight_buffer" / "weight_buffer.ipynb"
    if "weight_buffer" in parts and buffer_nb.exists():
        bparams: dict[str, Any] = {"report": True, **at_defaults("weight_buffer")}
        if quick:
            bparams.update(quick=True)
        jobs["weight_buffer"] = [Job("weight buffer", buffer_nb, bparams, out_of("weight_buffer"))]

    if "sim_accuracy" in parts:
        aparams: dict[str, Any] = {"report": True}
        if quick:
            aparams.update(models=["cnn"], methods=["gpipe", "pipedream"], steps=6, rounds=1,
                           held_out_rounds=0)
        else:   # one round of the held-out models here; held_out.py runs three (its committed results)
            aparams.update(held_out_rounds=1)
        nb = REPRODUCTIONS / "sim_accuracy" / "sim_accuracy.ipynb"
        jobs["sim_accuracy"] = [Job("simulator accuracy", nb, aparams, out_of("sim_accuracy"))]

    total = sum(len(v) for v in jobs.values())
    failures: list[str] = run_scripts([s for s in SCRIPTS if s in parts], out_of, quick=quick)
    if "convergence" in parts and not quick:
        failures += convergence_subset(out_of("convergence") / "subset")
    done: dict[str, list[tuple[Job, Path]]] = {}
    with tempfile.TemporaryDirectory() as tmpdir, tqdm(total=total, desc="reproduce", unit="notebook") as bar:
        tmp = Path(tmpdir)
        for part, js in jobs.items():
            try:
                done[part] = run_jobs(js, bar=bar, tmp=tmp)
            except RuntimeError as exc:
                failures.append(f"{part}: {exc}")
                bar.update(len(js) - len(done.get(part, [])))
        table = collect_table1(done["table1"]) if "table1" in done else None
        measure = None
        if "measure" in done:
            mrow = json.loads((done["measure"][0][0].out_dir / "row.json").read_text())
            measure = pd.DataFrame(
                [{k[len("measure_") :]: v for k, v in mrow.items() if k.startswith("measure_")}]
            )
        if table is not None:
            write_table(table, t1 / "results.csv")
            if args.full and not quick:   # the two unknowns over a grid: 250 simulated rows
                bar.set_postfix_str("table1 sensitivity")
                sens = pd.DataFrame(sensitivity())
                write_table(sens, t1 / "sensitivity.csv")
                atomic_write_text(t1 / "sensitivity.svg", sensitivity_svg(sens))
                bar.set_postfix_str("table1 alternatives")   # 50 cited alternatives, 100 rows
                write_table(pd.DataFrame(alternatives()), t1 / "alternatives.csv")
        if measure is not None:
            write_table(measure, t1 / "measure.csv")
            runs_json = done["measure"][0][0].out_dir / "measure_runs.json"
            if runs_json.exists():
                write_table(pd.DataFrame(json.loads(runs_json.read_text())["runs"]), t1 / "measure_runs.csv")
        md = table1_results_md(t1)   # from the files, so that a partial run keeps the other part
        if md:
            atomic_write_text(t1 / "results.md", md)
        if table is not None:
            sections = [(job.name, ex) for job, ex in done["table1"]] + [
                (job.name, ex) for job, ex in done.get("measure", [])
            ]
            build_report(sections, md, t1 / "report.html", title="PipeDream Table 1 with pipelab")
        for part in ("table1", "measure"):
            for job, _ in done.get(part, []):
                shutil.rmtree(job.out_dir, ignore_errors=True)
        if (t1 / "_runs").is_dir() and not any((t1 / "_runs").iterdir()):
            (t1 / "_runs").rmdir()
    if (t1 / "results.md").exists() and ("table1" in done or "measure" in done):
        print("\nPipeDream Table 1 (Narayanan et al., SOSP'19) vs pipelab:\n")
        print((t1 / "results.md").read_text())
        print(f"written under {t1}: results.csv, measure.csv, results.md, report.html")
    if out_root is not None:
        print_comparison(out_root, parts)
        print(f"\nthis run's results: {out_root}"
              + (f" (the defaults' subset: {', '.join(sorted(set(SUBSET) & set(parts)))} without their "
                 "full grids; `--full` runs them)" if subset and set(SUBSET) & set(parts) else ""))
    else:
        print("\nthe committed references under reproductions/ were rewritten: review `git diff` and commit")
    for f in failures:
        print("FAILED", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
