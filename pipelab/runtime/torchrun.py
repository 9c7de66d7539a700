"""The one torchrun entry point: ``torchrun --nproc-per-node N -m pipelab.runtime.torchrun job.json``.

Each torchrun process is one worker of the job (rendezvous ``env://``, ``RANK``/``WORLD_SIZE`` from
torchrun); rank 0 gathers the events and results and writes the job's outputs (:func:`save_outputs`):
``trace.jsonl``, ``state_dict.pt``, ``losses.json``. ``pipelab train job.json`` run as torchrun's
program lands here too.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch

from pipelab._io import atomic_write_bytes, atomic_write_text
from pipelab.runtime.guards import json_losses
from pipelab.runtime.job import load_job_file, prepare
from pipelab.runtime.launch import assemble
from pipelab.runtime.process import run_distributed


def save_outputs(out: Path, result: Any) -> None:
    """Write a run's ``trace.jsonl``, ``state_dict.pt`` and ``losses.json`` into ``out`` (atomically).

    ``losses.json`` is strict JSON: a non-finite loss is ``null``, its step listed in ``nonfinite_steps``.
    """

    out.mkdir(parents=True, exist_ok=True)
    result.trace.save_jsonl(out / "trace.jsonl")
    buf = io.BytesIO()
    torch.save(result.state_dict(), buf)
    atomic_write_bytes(out / "state_dict.pt", buf.getvalue())
    losses, bad = json_losses(result.losses)
    thr = result.throughput if math.isfinite(result.throughput) else None
    atomic_write_text(out / "losses.json", json.dumps({
        "losses": losses, "nonfinite_steps": bad, "throughput": thr,
        "versions_held": {str(k): v for k, v in result.versions_held.items()}}, indent=1, allow_nan=False) + "\n")


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
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if k not in os.environ:
            print(
                f"{k} is not set: run this under torchrun, or use `pipelab train job.json` without torchrun",
                file=sys.stderr,
            )
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
    _, gathered = run_distributed(job, rank, sink, init_method="env://",
                                  local_rank=int(os.environ.get("LOCAL_RANK", rank)), gather=True)
    if rank == 0:
        results = [r for r, _ in gathered]
        events = [e for _, evs in gathered for e in evs]
        res = assemble(job, events, results, 0.0)
        save_outputs(extra["out"], res)
        print(f"[pipelab] wrote {extra['out']}: losses {[round(x, 4) for x in res.losses]}, "
              f"{res.throughput:.1f} samples/s")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelab.runtime.torchrun job.json`` under torchrun (reads RANK, WORLD_SIZE, ...)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pipelab.runtime.torchrun job.json   (under torchrun)", file=sys.stderr)
        return 2
    return run_torchrun_worker(args[0])


if __name__ == "__main__":
    code = main()
    # the process group is destroyed and rank 0's outputs are written: leave without the interpreter's
    # finalization, where gloo's threads can still hold work objects whose tensors reference Python
    # and abort the process ("terminate called without an active exception", SIGABRT; seen once in
    # a CI run under load after the gather-and-barrier fix, never in 40 runs alone; pytorch/pytorch
    # PR 179291 describes the mechanism)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
