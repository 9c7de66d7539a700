"""A worker's checkpoints (:class:`Checkpointing`, mixed into :class:`~pipelab.runtime.worker.Worker`): its
state at a drained point, saved at the schedule's checkpoint steps (files: :mod:`.checkpoint_files`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from pipelab.runtime import checkpoint_files as ckpt
from pipelab.runtime.checkpoint_files import load_worker
from pipelab.runtime.guards import NonFiniteError, nonfinite_tensors
from pipelab.runtime.job import Job
from pipelab.runtime.stage import StageState
from pipelab.schedules.worker_view import checkpoint_points


class Checkpointing:
    """The checkpoint half of a worker (see the module docstring)."""

    job: Job
    rank: int
    process_rank: int      # names its checkpoint file (a tensor group's members each write their shard)
    stages: dict[int, StageState]
    rng_state: torch.Tensor
    warn: Callable[[str], None]
    #: the run's coordinator: ``on_saved(step, rank, sha256)`` once this worker's file is written
    on_saved: Callable[[int, int, str], None] | None = None

    def checkpoint_state(self) -> dict[str, Any]:
        """Per stage weights, optimizer and policy state, and the RNG, at a drained point (else raises)."""
        stages: dict[int, Any] = {}
        for s, st in self.stages.items():
            busy = sorted(set(st.policy.in_flight) | set(st.pending))
            if busy or st.policy.held != 1:
                raise RuntimeError(f"worker {self.rank} stage {s}: checkpoint requested while microbatches "
                                   f"{busy} are in flight ({st.policy.held} weight versions held); "
                                   "checkpoints need a drained pipeline (asynchronous schedules: build "
                                   "with drain_every=N)")
            anchor = getattr(st.policy, "anchor", None)     # HetPipe: the weights of the last pull
            if anchor is not None and (getattr(st.policy, "pull_pending", False) or not all(
                    torch.equal(anchor[n], p.detach()) for n, p in st.params.items())):
                raise RuntimeError(f"worker {self.rank} stage {s}: HetPipe checkpoint requested between a "
                                   "wave's push and its pull; the saved weights must be the server's")
            stages[s] = {"module": {k: v.detach().cpu().clone() for k, v in st.module.state_dict().items()},
                         "optimizer": st.optimizer.state_dict() if st.optimizer is not None else None,
                         "policy": st.policy.state_dict(), "version": st.policy.latest}
        return {"stages": stages, "rng": torch.get_rng_state()}

    def restore(self, path: Any) -> None:
        """Load this worker's state from ``path`` (plan and method checked); data restart at its step."""
        state = load_worker(path, self.process_rank, plan=self.job.plan, method=self.job.schedule.method)
        want = self.job.runtime.resume_step
        if int(state.get("step", want)) != want:
            raise ValueError(f"the checkpoint at {path} holds step {state.get('step')} but this run was "
                             f"planned to resume from step {want}; was the folder changed while it started?")
        for s, st in self.stages.items():
            saved = state["stages"].get(s)
            if saved is None:
                raise ValueError(f"the checkpoint at {path} has no stage {s} for worker {self.rank}")
            st.module.load_state_dict(saved["module"])    # in place: stashed aliases see the weights
            if st.optimizer is not None and saved["optimizer"] is not None:
                st.optimizer.load_state_dict(saved["optimizer"])
            st.policy.load_state_dict(saved["policy"])
        self.rng_state = state["rng"]

    @functools.cached_property
    def _checkpoint_points(self) -> dict[int, int]:
        """Action index -> run step of every checkpoint this worker takes."""
        rt = self.job.runtime
        return checkpoint_points(self.job.schedule, self.rank, rt.checkpoint_every or 0, rt.resume_step)

    def maybe_checkpoint(self, i: int) -> None:
        """After update ``i``: save if it is this worker's last action before a checkpoint step (HetPipe
        saves after the wave's pull, so the weights saved are the server's global weights)."""
        step = self._checkpoint_points.get(i) if self.job.runtime.checkpoint_every else None
        if step is None:
            return
        rng = torch.get_rng_state()     # this worker's stream (the reference executor swaps it in)
        waiting = [st.policy for st in self.stages.values() if getattr(st.policy, "pull_pending", False)]
        if not waiting:
            self._save_checkpoint(step, rng)
            return

        def pulled() -> None:
            if not any(getattr(p, "pull_pending", False) for p in waiting):
                self._save_checkpoint(step, rng)
        for p in waiting:
            p.after_pull = pulled  # type: ignore[attr-defined]

    def _save_checkpoint(self, step: int, rng: torch.Tensor) -> None:
        """Write this worker's file of ``step`` and report it to ``on_saved`` (the run's sealer); a
        non-finite state is not written, so the step is never sealed (``on_nonfinite="raise"`` raises)."""
        root = self.job.runtime.checkpoint_dir
        assert root is not None     # RuntimeOptions.from_options requires it with checkpoint_every
        plan, method = self.job.plan, self.job.schedule.method
        state = self.checkpoint_state()
        bad = nonfinite_tensors(state["stages"], "stages")
        if bad:
            msg = (f"checkpoint of step {step} not written: worker {self.rank}'s state holds non-finite "
                   f"values ({', '.join(bad[:3])}); the newest sealed checkpoint is the last finite one")
            if self.job.runtime.on_nonfinite == "raise":
                raise NonFiniteError(msg)
            self.warn(msg)
            return
        state["rng"] = rng
        state["step"] = state["data_position"] = step     # minibatches consumed; data() resumes there
        _, sha = ckpt.write_worker(root, step, self.process_rank, state, plan=plan, method=method,
                                   run_id=self.job.run_id)
        if self.on_saved is not None:
            self.on_saved(step, self.process_rank, sha)
            return
        # no coordinator (a Worker used on its own): the last worker to write its file seals the checkpoint
        d = ckpt.step_dir(root, step)
        sealer = sealer_for(self.job)
        if sealer is not None and all((d / f"rank-{r}.pt").exists() for r in range(self.job.world_size)):
            sealer.seal(step)


def sealer_for(job: Job) -> ckpt.Sealer | None:
    """The coordinator that seals ``job``'s checkpoints (``None`` when it takes none)."""
    rt = job.runtime
    if not rt.checkpoint_every or rt.checkpoint_dir is None:
        return None
    drained = {"drain_every": rt.checkpoint_every} if job.schedule.options.get("segments") else {}
    return ckpt.Sealer(rt.checkpoint_dir, plan=job.plan, method=job.schedule.method,
                       num_workers=job.world_size, run_id=job.run_id, extra=drained, keep=rt.checkpoint_keep)
