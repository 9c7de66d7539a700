"""``pipelab train job.json``: run a job described by a JSON file, locally or under torchrun.

Without torchrun's environment (``RANK``/``WORLD_SIZE``) the job starts its own worker processes
on this machine (``--backend local`` runs the reference executor instead). Under torchrun
(``torchrun --nproc-per-node 4 -m pipelab.runtime.torchrun job.json``, or ``pipelab train job.json``
as the torchrun program) each process is one worker, rendezvous is ``env://`` and rank 0 writes the
outputs. Outputs go to the job's ``out`` folder: ``trace.jsonl``, ``state_dict.pt``, ``losses.json``.
A job file is data unless ``--trust`` (see :func:`pipelab.runtime.job.load_job_file`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    """``pipelab train JOB.json [--backend gloo|local] [--out DIR]``."""
    p = argparse.ArgumentParser(prog="pipelab train", description=__doc__.splitlines()[0])
    p.add_argument("job", help="job.json (callables as 'module:function', plan, method, steps, ...)")
    p.add_argument("--backend", choices=("gloo", "nccl", "local"), help="override the job's backend")
    p.add_argument("--out", help="output folder (default: the job's 'out', or JOB.out beside it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--trust", action="store_true",
                   help="run a job file that names functions outside its folder and the current project, or "
                        "writes outside its folder (a job file is data unless trusted)")
    a = p.parse_args(list(argv) if argv is not None else None)
    if not Path(a.job).is_file():
        print(f"pipelab train: error: no job file {a.job} (pass the path of a job.json)", file=sys.stderr)
        return 2
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        from pipelab.runtime.torchrun import run_torchrun_worker  # torch-heavy: see below

        return run_torchrun_worker(a.job, trust=a.trust)
    # torch-heavy: imported once a command runs, so that `pipelab --help` stays fast
    from pipelab.runtime.job import load_job_file
    from pipelab.runtime.launch import WorkerError, train
    from pipelab.runtime.torchrun import save_outputs

    try:
        args, extra = load_job_file(a.job, trust=a.trust)
        if a.backend:
            args["backend"] = a.backend
        out = Path(a.out) if a.out else extra["out"]
        result = train(progress=not a.no_progress, **args)
    except (ValueError, TypeError, OSError) as exc:    # bad input: one line, no traceback
        print(f"pipelab train: error: {exc}", file=sys.stderr)
        return 2
    except WorkerError as exc:                         # the job failed: the worker's own report
        print(f"pipelab train: error: {exc}", file=sys.stderr)
        return 1
    save_outputs(out, result)
    print(f"wrote {out}: final loss {result.losses[-1]:.4f}, {result.throughput:.1f} samples/s")
    return 0

