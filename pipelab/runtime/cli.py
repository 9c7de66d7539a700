"""``pipelab train job.json``: run a job described by a JSON file, locally or under torchrun.

Without torchrun's environment (``RANK``/``WORLD_SIZE``) the job starts its own worker processes
on this machine (``--backend local`` runs the reference executor instead). Under torchrun
(``torchrun --nproc-per-node 4 -m pipelab.runtime.worker job.json``, or ``pipelab train job.json``
as the torchrun program) each process is one worker, rendezvous is ``env://`` and rank 0 writes the
outputs. Outputs go to the job's ``out`` folder: ``trace.jsonl``, ``state_dict.pt``, ``losses.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from pipelab._io import atomic_write_bytes, atomic_write_text


def _save_outputs(out: Path, result: Any) -> None:
    import io

    out.mkdir(parents=True, exist_ok=True)
    result.trace.save_jsonl(out / "trace.jsonl")
    buf = io.BytesIO()
    torch.save(result.state_dict(), buf)
    atomic_write_bytes(out / "state_dict.pt", buf.getvalue())
    atomic_write_text(out / "losses.json", json.dumps({
        "losses": result.losses, "throughput": result.throughput,
        "versions_held": {str(k): v for k, v in result.versions_held.items()}}, indent=1) + "\n")


class _ListSink:
    """Keeps events in memory (gathered to rank 0 at the end) and reports errors on stderr."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, ev: Any) -> None:
        self.events.append(ev)

    def flush(self) -> None:
        pass

    def error(self, stage: int, action: str, tb: str) -> None:
        print(f"[pipelab] rank {os.environ.get('RANK')} failed at stage {stage}, action {action}:\n{tb}",
              file=sys.stderr)


def run_torchrun_worker(job_path: str) -> int:
    """One torchrun process: execute this rank's actions; rank 0 writes the outputs."""
    from pipelab.runtime.job import load_job_file, prepare
    from pipelab.runtime.launch import assemble, to_event
    from pipelab.runtime.worker import run_distributed

    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if k not in os.environ:
            print(f"{k} is not set: run this under torchrun, or use `pipelab train job.json` without torchrun",
                  file=sys.stderr)
            return 2
    torch.set_num_threads(1)
    args, extra = load_job_file(job_path)
    job = prepare(check_rendezvous=False, **args)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != job.world_size:
        print(f"torchrun started {world} processes but the plan has {job.world_size} workers; "
              f"use --nproc-per-node/--nnodes for {job.world_size}", file=sys.stderr)
        return 2
    sink = _ListSink()
    result = run_distributed(job, rank, sink, init_method="env://",
                             local_rank=int(os.environ.get("LOCAL_RANK", rank)), gather=True)
    if rank == 0:
        results = [r for r, _ in result["all"]]
        events = [to_event(e) for _, evs in result["all"] for e in evs]
        for r in results:
            r.pop("all", None)
        res = assemble(job, events, results, 0.0)
        _save_outputs(extra["out"], res)
        print(f"[pipelab] wrote {extra['out']}: losses {[round(x, 4) for x in res.losses]}, "
              f"{res.throughput:.1f} samples/s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``pipelab train JOB.json [--backend gloo|local] [--out DIR]``."""
    p = argparse.ArgumentParser(prog="pipelab train", description=__doc__.splitlines()[0])
    p.add_argument("job", help="job.json (callables as 'module:function', plan, method, steps, ...)")
    p.add_argument("--backend", choices=("gloo", "nccl", "local"), help="override the job's backend")
    p.add_argument("--out", help="output folder (default: the job's 'out', or JOB.out beside it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = p.parse_args(list(argv) if argv is not None else None)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return run_torchrun_worker(a.job)
    from pipelab.runtime.job import load_job_file
    from pipelab.runtime.launch import train

    args, extra = load_job_file(a.job)
    if a.backend:
        args["backend"] = a.backend
    out = Path(a.out) if a.out else extra["out"]
    result = train(progress=not a.no_progress, **args)
    _save_outputs(out, result)
    print(f"wrote {out}: final loss {result.losses[-1]:.4f}, {result.throughput:.1f} samples/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
