"""The reference executor: the same Schedule, Workers and weight policies in one process (the oracle).

It runs each worker's next action as soon as its inputs are ready (its messages are in the
mailbox; for a replicated ``U``, every replica reached its ``U``, whose gradients are then summed).
Each worker's own order is the schedule's; if none can move, the error lists every stuck action.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

import pipelab.methods as methods
from pipelab.runtime.comm import Mailbox
from pipelab.runtime.job import Job
from pipelab.runtime.param_server import WSPServer
from pipelab.runtime.policies import LocalWSP
from pipelab.runtime.worker import Worker, WorkerResult
from pipelab.trace import Event


def run_local(job: Job, emit: Callable[[Event], None] | None = None,
              should_stop: Callable[[], bool] | None = None,
              on_saved: Callable[[int, int, str], None] | None = None) -> list[WorkerResult]:
    """Execute ``job`` in this process; return each rank's :meth:`Worker.result`.

    ``emit`` gets one event per action; ``should_stop`` is polled between actions; ``on_saved`` seals
    checkpoints (by default the last worker to write seals). The caller's random state is kept.
    """
    with torch.random.fork_rng(devices=[]):
        return _LocalRun(job, emit, on_saved).run(should_stop)


class _LocalRun:
    """One reference execution: every rank's Worker, the mailbox, each worker's next action."""

    def __init__(self, job: Job, emit: Callable[[Event], None] | None,
                 on_saved: Callable[[int, int, str], None] | None) -> None:
        self.job, self.sched, self.emit = job, job.schedule, emit
        device = job.runtime.device or "cpu"     # device="cuda": every stage on the GPU
        self.workers = [Worker(job, r, device) for r in range(self.sched.num_workers)]
        self.box = Mailbox()
        for w in self.workers:
            w.on_saved = on_saved
            if w.meter is not None:   # one process: the storage count, never the CUDA allocator's shared peak
                w.meter.messages = (lambda r: lambda: self.box.held(r))(w.rank)
        self.wsp_servers: dict[int, Any] = {}
        if methods.get(self.sched.method).weights == "wsp":   # HetPipe: one server shard per stage
            V, D = len(self.sched.stage_ranks[0]), int(job.options.get("D", 0))
            for w in self.workers:
                for s, st in w.stages.items():
                    if s not in self.wsp_servers:
                        self.wsp_servers[s] = WSPServer(dict(st.params), V, D, stage=s)
                w.attach_wsp(lambda s, vw: LocalWSP(self.wsp_servers[s], vw))
        self.pos = [0] * len(self.workers)
        self.t0 = time.perf_counter()
        # shared parameters: (rank, action index) -> tie groups still to sum before that U
        self.ties_left: dict[tuple[int, int], list[int]] = {
            (w.rank, i): [g.index for g in groups] for w in self.workers for i, groups in w.ties.due.items()}

    def run(self, should_stop: Callable[[], bool] | None) -> list[WorkerResult]:
        """Run every worker's next ready action until all are done; raise on a deadlock."""
        workers, pos = self.workers, self.pos
        while any(pos[w.rank] < len(w.actions) for w in workers):
            moved = self.reduce_ties()
            for w in workers:
                while pos[w.rank] < len(w.actions) and self.ready(w):
                    self.step(w)
                    moved = True
                    if should_stop is not None and should_stop():
                        raise KeyboardInterrupt("cancelled")
            if not moved:
                stuck = ", ".join(f"worker {w.rank} at step {pos[w.rank]} ({w.actions[pos[w.rank]]})"
                                  for w in workers if pos[w.rank] < len(w.actions))
                raise RuntimeError(f"the schedule deadlocks: no worker can run its next action: {stuck}; "
                                   "check it with pipelab.schedules.validate")
        for w in workers:
            self.finish_pulls(w)
        results = [w.result() for w in workers]
        if self.wsp_servers:
            results[0].wsp_log = sorted((e for srv in self.wsp_servers.values() for e in srv.log),
                                        key=lambda e: e.t)
        return results

    @staticmethod
    def finish_pulls(w: Worker) -> None:
        """Complete a deferred HetPipe pull before the worker's next action, as in its process."""
        for st in w.stages.values():
            if getattr(st.policy, "pull_pending", False):
                if st.policy.pull_blocked():  # type: ignore[attr-defined]
                    raise RuntimeError(f"worker {w.rank}: the HetPipe pull of stage {st.index} can never be "
                                       "served (a virtual worker ran out of minibatches before the others)")
                st.policy.complete_pull()  # type: ignore[attr-defined]

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def ev(self, w: Worker, i: int, start: float, nbytes: int, version: int) -> None:
        if self.emit is not None:
            a = w.actions[i]
            self.emit(Event(w.rank, a.stage, a.kind, a.microbatch, start, self.now(), nbytes, version, i, -1))

    def reduce_ties(self) -> bool:
        """Sum every tie group whose workers all wait for it at their next ``U``, as the all-reduce does
        (in rank order); returns whether one was summed."""
        moved = False
        for g in self.job.ties:
            members = [self.workers[r] for r in g.ranks]
            at = [(m.rank, self.pos[m.rank]) for m in members]
            if not all(self.ties_left.get(k, [None])[0] == g.index for k in at):
                continue
            start = self.now()
            parts = [dict(m.tie_contributions(self.pos[m.rank]))[g] for m in members]
            total = parts[0].clone()
            for x in parts[1:]:
                total += x
            for m, k in zip(members, at):
                m.tie_results([(g, total.clone())])
                self.ties_left[k].pop(0)
                if self.emit is not None:
                    self.emit(Event(m.rank, m.actions[k[1]].stage, "allreduce", m.actions[k[1]].microbatch,
                                    start, self.now(), total.numel() * total.element_size(), -1, -1, -1))
            moved = True
        return moved

    def ready(self, w: Worker) -> bool:
        """Whether ``w``'s next action has its messages, its pull, (a synced ``U``) its replicas, and its
        shared parameters' sums."""
        i = self.pos[w.rank]
        a = w.actions[i]
        if self.ties_left.get((w.rank, i)):
            return False
        if not all(self.box.ready(w.rank, r) for r in w.recvs(i)):
            return False
        if any(getattr(st.policy, "pull_pending", False) and st.policy.pull_blocked()  # type: ignore[attr-defined]
               for st in w.stages.values()):
            return False   # HetPipe: this virtual worker waits for the global clock
        if a.kind == "U" and self.job.syncs(a.stage):
            for x in self.sched.stage_ranks[a.stage]:
                wx, j = self.workers[x], self.pos[x]
                if j >= len(wx.actions):
                    return False
                b = wx.actions[j]
                if not (b.kind == "U" and b.stage == a.stage and wx.u_pair[j] == w.u_pair[i]):
                    return False
        return True

    def step(self, w: Worker) -> None:
        """Run ``w``'s next action on its own random stream, as in its own process."""
        torch.set_rng_state(w.rng_state)
        try:
            a = w.actions[self.pos[w.rank]]
            if a.kind == "U" and self.job.syncs(a.stage):
                self.synced_update(a.stage, [self.workers[x] for x in self.sched.stage_ranks[a.stage]])
            else:
                self.action(w)
        finally:
            w.rng_state = torch.get_rng_state()

    def synced_update(self, stage: int, group: list[Worker]) -> None:
        """A replicated stage's ``U`` on every replica, their gradients summed as the all-reduce does."""
        pos = self.pos
        start = self.now()
        flats = [g.begin_update(pos[g.rank]) for g in group]
        total = None
        if flats[0] is not None:
            total = flats[0].clone()
            for f in flats[1:]:
                assert f is not None
                total += f   # for two replicas exactly the a + b the all-reduce computes
        if total is not None and self.emit is not None:   # the all-reduce's own event, as in a process
            t = self.now()
            for g in group:
                self.emit(Event(g.rank, stage, "allreduce", g.actions[pos[g.rank]].microbatch, start, t,
                                total.numel() * total.element_size(), -1, -1, -1))
            start = t
        for g in group:
            j = pos[g.rank]
            torch.set_rng_state(g.rng_state)
            v = g.finish_update(j, None if total is None else total.clone())
            self.ev(g, j, start, 0, v)
            g.measure(j)
            pos[g.rank] += 1

    def action(self, w: Worker) -> None:
        """``w``'s next ``F``/``B``/``W`` (its messages taken from the mailbox) or unsynced ``U``."""
        i = self.pos[w.rank]
        self.finish_pulls(w)
        received = [self.box.take(w.rank, r) for r in w.recvs(i)]
        start = self.now()
        if w.actions[i].kind == "U":
            self.ev(w, i, start, 0, w.finish_update(i, w.begin_update(i)))
        else:
            sends, v = w.run(i, received)
            nbytes = sum(self.box.put(w.rank, s) for s in sends)
            w.slow_down(self.now() - start)
            self.ev(w, i, start, nbytes, v)
        w.measure(i)
        self.pos[w.rank] += 1
