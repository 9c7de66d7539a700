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
        return _run_local(job, emit, should_stop, on_saved)


def _run_local(job: Job, emit: Callable[[Event], None] | None, should_stop: Callable[[], bool] | None,
               on_saved: Callable[[int, int, str], None] | None) -> list[WorkerResult]:
    sched = job.schedule
    device = job.runtime.device or "cpu"     # device="cuda": every stage on the GPU
    workers = [Worker(job, r, device) for r in range(sched.num_workers)]
    for w in workers:
        w.on_saved = on_saved
    box = Mailbox()
    for w in workers:
        if w.meter is not None:   # one process: the storage count, never the CUDA allocator's shared peak
            w.meter.messages = (lambda r: lambda: box.held(r))(w.rank)
    wsp_servers: dict[int, Any] = {}
    if methods.get(sched.method).weights == "wsp":   # HetPipe: one in-process WSP server shard per stage
        V = len(sched.stage_ranks[0])
        D = int(job.options.get("D", 0))
        for w in workers:
            for s, st in w.stages.items():
                if s not in wsp_servers:
                    wsp_servers[s] = WSPServer(dict(st.params), V, D, stage=s)
            w.attach_wsp(lambda s, vw: LocalWSP(wsp_servers[s], vw))

    def finish_pulls(w: Worker) -> None:
        # a deferred HetPipe pull completes before the worker's next action, as in its process
        for st in w.stages.values():
            if getattr(st.policy, "pull_pending", False):
                if st.policy.pull_blocked():  # type: ignore[attr-defined]
                    raise RuntimeError(f"worker {w.rank}: the HetPipe pull of stage {st.index} can never be "
                                       "served (a virtual worker ran out of minibatches before the others)")
                st.policy.complete_pull()  # type: ignore[attr-defined]
    pos = [0] * len(workers)
    t0 = time.perf_counter()

    def now() -> float:
        return time.perf_counter() - t0

    def ev(w: Worker, i: int, start: float, nbytes: int, version: int) -> None:
        if emit is not None:
            a = w.actions[i]
            emit(Event(w.rank, a.stage, a.kind, a.microbatch, start, now(), nbytes, version, i, -1))

    def ready(w: Worker) -> bool:
        i = pos[w.rank]
        a = w.actions[i]
        if not all(box.ready(w.rank, r) for r in w.recvs(i)):
            return False
        if any(getattr(st.policy, "pull_pending", False) and st.policy.pull_blocked()  # type: ignore[attr-defined]
               for st in w.stages.values()):
            return False   # HetPipe: this virtual worker waits for the global clock
        if a.kind == "U" and job.syncs(a.stage):
            for x in sched.stage_ranks[a.stage]:
                wx = workers[x]
                j = pos[x]
                if j >= len(wx.actions):
                    return False
                b = wx.actions[j]
                if not (b.kind == "U" and b.stage == a.stage and wx.u_pair[j] == w.u_pair[i]):
                    return False
        return True

    def step(w: Worker) -> None:
        torch.set_rng_state(w.rng_state)     # each worker's own random stream, as in its own process
        try:
            _step(w)
        finally:
            w.rng_state = torch.get_rng_state()

    def _step(w: Worker) -> None:
        i = pos[w.rank]
        a = w.actions[i]
        if a.kind == "U" and job.syncs(a.stage):
            group = [workers[x] for x in sched.stage_ranks[a.stage]]
            start = now()
            flats = [g.begin_update(pos[g.rank]) for g in group]
            total = None
            if flats[0] is not None:
                total = flats[0].clone()
                for f in flats[1:]:
                    assert f is not None
                    total += f   # for two replicas exactly the a + b the all-reduce computes
            if total is not None and emit is not None:   # the all-reduce's own event, as in a process
                t = now()
                for g in group:
                    emit(Event(g.rank, a.stage, "allreduce", g.actions[pos[g.rank]].microbatch, start, t,
                               total.numel() * total.element_size(), -1, -1, -1))
                start = t
            for g in group:
                j = pos[g.rank]
                torch.set_rng_state(g.rng_state)
                v = g.finish_update(j, None if total is None else total.clone())
                ev(g, j, start, 0, v)
                g.measure(j)
                pos[g.rank] += 1
            return
        finish_pulls(w)
        received = [box.take(w.rank, r) for r in w.recvs(i)]
        start = now()
        if a.kind == "U":
            v = w.finish_update(i, w.begin_update(i))
            ev(w, i, start, 0, v)
        else:
            sends, v = w.run(i, received)
            nbytes = sum(box.put(w.rank, s) for s in sends)
            w.slow_down(now() - start)
            ev(w, i, start, nbytes, v)
        w.measure(i)
        pos[w.rank] += 1

    while any(pos[w.rank] < len(w.actions) for w in workers):
        moved = False
        for w in workers:
            while pos[w.rank] < len(w.actions) and ready(w):
                step(w)
                moved = True
                if should_stop is not None and should_stop():
                    raise KeyboardInterrupt("cancelled")
        if not moved:
            stuck = ", ".join(f"worker {w.rank} at step {pos[w.rank]} ({w.actions[pos[w.rank]]})"
                              for w in workers if pos[w.rank] < len(w.actions))
            raise RuntimeError(f"the schedule deadlocks: no worker can run its next action: {stuck}; "
                               "check it with pipelab.schedules.validate")
    for w in workers:
        finish_pulls(w)
    results = [w.result() for w in workers]
    if wsp_servers:
        results[0].wsp_log = sorted((e for srv in wsp_servers.values() for e in srv.log), key=lambda e: e.t)
    return results
