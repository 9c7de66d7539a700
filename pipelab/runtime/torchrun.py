"""The torchrun entry point: ``torchrun --nproc-per-node N -m pipelab.runtime.torchrun job.json``.

Each torchrun process is one worker (``env://`` rendezvous); rank 0 gathers events and results and
writes the outputs (:func:`save_outputs`). ``pipelab train job.json`` under torchrun lands here.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from pipelab._io import atomic_write_bytes, atomic_write_text
from pipelab.runtime import checkpoint_files as ckpt
from pipelab.runtime.checkpoint_files import FolderLock
from pipelab.runtime.checkpoint_files import clean as clean_checkpoints
from pipelab.runtime.guards import json_losses
from pipelab.runtime.job import TrainArgs, load_job_file, prepare
from pipelab.runtime.launch import assemble
from pipelab.runtime.lifeline import watch_launcher
from pipelab.runtime.process import run_distributed
from pipelab.runtime.worker_checkpoint import sealer_for


def save_outputs(out: Path, result: Any) -> None:
    """Write ``trace.jsonl``, ``state_dict.pt`` and strict-JSON ``losses.json`` into ``out``, atomically."""
    out.mkdir(parents=True, exist_ok=True)
    result.trace.save_jsonl(out / "trace.jsonl")
    buf = io.BytesIO()
    torch.save(result.state_dict(), buf)
    atomic_write_bytes(out / "state_dict.pt", buf.getvalue())
    losses, bad = json_losses(result.losses)
    thr = result.throughput if math.isfinite(result.throughput) else None
    atomic_write_text(out / "losses.json", json.dumps({
        "losses": losses, "nonfinite_steps": bad, "throughput": thr,
        "versions_held": {str(k): v for k, v in result.versions_held.items()}},
        indent=1, allow_nan=False) + "\n")


class _FileSealer:
    """Rank 0's checkpoint coordinator under torchrun: seals a step once every rank's file is on disk."""

    def __init__(self, job: Any) -> None:
        self.job, self.sealer = job, sealer_for(job)
        self.threads: list[threading.Thread] = []

    def saved(self, step: int, rank: int, sha256: str) -> None:
        t = threading.Thread(target=self._seal, args=(step,), daemon=True, name=f"pipelab-seal-{step}")
        t.start()
        self.threads.append(t)

    def _seal(self, step: int) -> None:
        d = ckpt.step_dir(self.job.runtime.checkpoint_dir, step)
        deadline = time.time() + self.job.timeout
        while time.time() < deadline:
            if all((d / f"rank-{r}.pt").exists() for r in range(self.job.world_size)):
                assert self.sealer is not None
                for r in range(self.job.world_size):
                    self.sealer.report(step, r, ckpt.sha256_of(d / f"rank-{r}.pt"))
                return
            time.sleep(0.05)

    def join(self) -> None:
        for t in self.threads:
            t.join(self.job.timeout)


class _ListSink:
    """Keeps events in memory (gathered to rank 0 at the end) and reports errors on stderr."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.sealer: _FileSealer | None = None

    def saved(self, step: int, rank: int, sha256: str) -> None:
        if self.sealer is not None:     # rank 0 coordinates; other ranks' files are found on disk
            self.sealer.saved(step, rank, sha256)

    def emit(self, ev: Any) -> None:
        self.events.append(ev)

    def error(self, stage: int, action: str, tb: str) -> None:
        print(f"[pipelab] rank {os.environ.get('RANK')} failed at stage {stage}, action {action}:\n{tb}",
              file=sys.stderr)


def run_torchrun_worker(job_path: str, *, trust: bool = False) -> int:
    """One torchrun process: run this rank's actions; rank 0 writes the outputs and seals checkpoints."""
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if k not in os.environ:
            print(f"{k} is not set: run this under torchrun, or use `pipelab train job.json` without "
                  "torchrun", file=sys.stderr)
            return 2
    torch.set_num_threads(1)
    watch_launcher()
    args, extra = load_job_file(job_path, trust=trust)
    job = prepare(TrainArgs.of(**args), check_rendezvous=False)
    # one identity for every rank's files and the manifest: the same in every process of this run
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or "{MASTER_ADDR}:{MASTER_PORT}".format(**os.environ)
    job = dataclasses.replace(job, run_id=run_id)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != job.world_size:
        print(f"torchrun started {world} processes but the plan runs on {job.world_size} (one per device: "
              "Plan.num_devices, replicas x tensor degree); "
              f"use --nproc-per-node/--nnodes for {job.world_size}", file=sys.stderr)
        return 2
    sink = _ListSink()
    lock = None
    if rank == 0 and job.runtime.checkpoint_every and job.runtime.checkpoint_dir:
        lock = FolderLock(job.runtime.checkpoint_dir)
        clean_checkpoints(job.runtime.checkpoint_dir)
        sink.sealer = _FileSealer(job)
    try:
        _, gathered = run_distributed(job, rank, sink, init_method="env://",
                                      local_rank=int(os.environ.get("LOCAL_RANK", rank)), gather=True)
        if sink.sealer is not None:
            sink.sealer.join()
    finally:
        if lock is not None:
            lock.release()
    if rank == 0:
        res = assemble(job, [e for _, evs in gathered for e in evs], [r for r, _ in gathered], 0.0)
        save_outputs(extra["out"], res)
        print(f"[pipelab] wrote {extra['out']}: losses {[round(x, 4) for x in res.losses]}, "
              f"{res.throughput:.1f} samples/s")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelab.runtime.torchrun job.json`` under torchrun (reads RANK, WORLD_SIZE, ...)."""
    args = list(sys.argv[1:] if argv is None else argv)
    trust = "--trust" in args
    args = [a for a in args if a != "--trust"]
    if len(args) != 1:
        print("usage: python -m pipelab.runtime.torchrun job.json [--trust]   (under torchrun)",
              file=sys.stderr)
        return 2
    return run_torchrun_worker(args[0], trust=trust)


if __name__ == "__main__":
    code = main()
    # outputs written: skip the interpreter's finalization, where gloo's threads can still hold tensors
    # and abort the process (SIGABRT; pytorch/pytorch PR 179291 describes the mechanism)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
