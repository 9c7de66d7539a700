"""``pipelab train job.json``: run a job described by a JSON file, locally or under torchrun.

Without torchrun's ``RANK``/``WORLD_SIZE`` the job starts its own worker processes; under torchrun each
process is one worker and rank 0 writes ``trace.jsonl``, ``state_dict.pt`` and ``losses.json`` to the
job's ``out`` folder. A job file is data unless ``--trust`` (the format: ``docs/job_format.md``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pipelab.cli._common import Parser, fail

PROG = "pipelab train"


def main(argv: Sequence[str] | None = None) -> int:
    """``pipelab train JOB.json [--backend gloo|local] [--out DIR] [--chrome FILE]``."""
    p = Parser(prog=PROG, description=(
        "Train a job described by a JSON file (model, data, loss and optimizer as package.module:function, "
        "plan, method, steps, ...) on this machine's processes, or as one worker under torchrun."))
    p.add_argument("job", help="job.json (its keys: docs/job_format.md; examples/job.json is one)")
    p.add_argument("--backend", choices=("gloo", "nccl", "local"), help="override the job's backend")
    p.add_argument("--out", help="output folder (default: the job's 'out', or JOB.out beside it)")
    p.add_argument("--chrome", metavar="FILE", help="also write the measured trace for Perfetto / chrome://tracing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--trust", action="store_true",
                   help="run a job file that names functions outside its folder and the current project, or "
                        "writes outside its folder (a job file is data unless trusted)")
    a = p.parse_args(argv)
    job = Path(a.job)
    if not job.is_file():
        return fail(PROG, f"no job file {a.job} (pass the path of a job.json; examples/job.json is one)")
    for path in (str(Path.cwd()), str(job.resolve().parent)):   # first on the import path, for workers too
        sys.path[:] = [path, *(p for p in sys.path if p != path)]
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        from pipelab.runtime.torchrun import run_torchrun_worker

        return run_torchrun_worker(a.job, trust=a.trust)
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
        return fail(PROG, exc)
    except WorkerError as exc:                         # the job failed: the worker's own report
        return fail(PROG, exc, code=1)
    save_outputs(out, result)
    print(result.describe())
    print(f"wrote {out} (trace.jsonl, state_dict.pt, losses.json)")
    if a.chrome:
        print(f"wrote {result.trace.to_chrome_trace(a.chrome)} (open in https://ui.perfetto.dev)")
    return 0
