"""A worker process: start-up, the distributed execute loop, streaming events to the parent.

:func:`process_main` is what ``pl.train`` spawns; :func:`run_distributed` (also torchrun's) joins
the process group and runs :func:`execute`, which moves a Worker's messages over
:class:`~pipelab.runtime.comm.DistComm`; :class:`PipeSink` streams the events to the parent.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from pipelab.runtime import shm
from pipelab.runtime.affinity import pin_worker
from pipelab.runtime.comm import MATCH_MODES, DistComm, grad_specs, peer_orders
from pipelab.runtime.job import Job
from pipelab.runtime.lifeline import ORPHANED_EXIT, use_loopback, watch_launcher
from pipelab.runtime.options import tune_malloc
from pipelab.runtime.param_server import WSPClient
from pipelab.runtime.tensor_group import GroupComm, make_groups, replica_groups, tie_process_groups
from pipelab.runtime.tensor_parallel import Group
from pipelab.runtime.worker import Worker, WorkerResult
from pipelab.trace import Event

LOOKAHEAD = 4   # post the receives of this many upcoming actions early


class Clock:
    """Seconds since the job's common start (rank 0's wall clock after the start barrier)."""

    def __init__(self, t0_wall: float) -> None:
        self.offset = time.time() - t0_wall
        self.base = time.perf_counter()

    def now(self) -> float:
        """Seconds since the common start."""
        return time.perf_counter() - self.base + self.offset


class PipeSink:
    """Streams events to the parent over this worker's pipe, in batches; each written before returning."""

    def __init__(self, conn: Any, rank: int, batch: int = 32, every_s: float = 0.1) -> None:
        self.conn, self.rank, self.batch, self.every_s = conn, rank, batch, every_s
        self.buf: list[Event] = []
        self.last = time.perf_counter()
        self.reported = False

    def _send(self, msg: Any) -> None:
        try:
            self.conn.send(msg)
        except (BrokenPipeError, ConnectionResetError, EOFError):   # the launcher is gone
            os._exit(ORPHANED_EXIT)

    def emit(self, ev: Event) -> None:
        """Queue one event; send the batch when it is big or old enough."""
        self.buf.append(ev)
        if len(self.buf) >= self.batch or time.perf_counter() - self.last > self.every_s:
            self.flush()

    def flush(self) -> None:
        """Send what is buffered."""
        if self.buf:
            self._send(("events", self.rank, self.buf))
            self.buf = []
        self.last = time.perf_counter()

    def done(self, result: WorkerResult) -> None:
        """Send the final result as bytes (a tensor's shared memory vanishes when this process exits)."""
        self.flush()
        buf = io.BytesIO()
        torch.save(result, buf)
        self._send(("done", self.rank, buf.getvalue()))

    def error(self, stage: int, action: str, tb: str) -> None:
        """Report a failure (once), stamped with the wall time it was raised at."""
        if self.reported:
            return
        self.reported = True
        self.flush()
        self._send(("error", self.rank, (stage, action, tb, time.time())))

    def saved(self, step: int, rank: int, sha256: str) -> None:
        """Tell the coordinator this worker's file of checkpoint ``step`` is written."""
        self._send(("saved", rank, (step, sha256)))

    def warn(self, text: str) -> None:
        """A warning for the parent to issue (``on_nonfinite="warn"``)."""
        self._send(("warning", self.rank, text))


def execute(worker: Worker, comm: DistComm, clock: Clock, emit: Callable[[Event], None]) -> None:
    """Run every action of ``worker`` in order over ``comm``, emitting one event per action."""
    n = len(worker.actions)
    for i, a in enumerate(worker.actions):
        worker.current = a     # before posting: an error there names this action
        for j in range(i, min(i + LOOKAHEAD, n)):
            for r in worker.recvs(j):
                comm.post(r)
        received = []
        for r in worker.recvs(i):
            t = clock.now()
            received.append(comm.wait(r))
            t2 = clock.now()
            if t2 - t > 1e-4:
                emit(Event(worker.rank, a.stage, "recv", a.microbatch, t, t2,
                           sum(s.nbytes for s in r.specs), -1, -1, r.src))
        comm.retire(worker.retire_after(i))
        start = clock.now()
        nbytes = 0
        if a.kind == "U":
            sums = worker.tie_contributions(i)
            if sums:     # shared parameters: their holders' gradients summed before the first U
                for g, total in sums:
                    comm.allreduce(g.key, total)
                worker.tie_results(sums)
                t = clock.now()
                emit(Event(worker.rank, a.stage, "allreduce", a.microbatch, start, t,
                           sum(x.numel() * x.element_size() for _, x in sums), -1, -1, -1))
                start = t
            flat = worker.begin_update(i)
            if flat is not None:
                # the all-reduce is its own event, as in a simulated trace: the U that follows holds
                # the optimizer step only, so busy time and bubbles read alike in both
                comm.allreduce(a.stage, flat)
                if worker.device.type == "cuda":
                    torch.cuda.synchronize(worker.device)
                t = clock.now()
                emit(Event(worker.rank, a.stage, "allreduce", a.microbatch, start, t,
                           flat.numel() * flat.element_size(), -1, -1, -1))
                start = t
            version = worker.finish_update(i, flat)
        else:
            sends, version = worker.run(i, received)
            for s in sends:
                nbytes += comm.send(s)
        if worker.device.type == "cuda":
            torch.cuda.synchronize(worker.device)
        worker.slow_down(clock.now() - start)
        emit(Event(worker.rank, a.stage, a.kind, a.microbatch, start, clock.now(), nbytes, version, i, -1))
        worker.measure(i)
    comm.flush()


def p2p_match(backend: str, requested: str | None = None) -> str:
    """Message matching: NCCL by order; gloo by ``requested``, else ``PIPELAB_P2P_MATCH``, else by tag."""
    if backend == "nccl":
        return "order"
    mode = requested or os.environ.get("PIPELAB_P2P_MATCH") or "tag"
    if mode not in MATCH_MODES:
        raise ValueError(f"PIPELAB_P2P_MATCH={mode!r}; use one of {MATCH_MODES}")
    return mode


def stage_device(job: Job, rank: int, local_rank: int | None = None) -> torch.device:
    """The device of worker ``rank``'s stages: NCCL one GPU each; gloo the CPU or GPU ``local_rank % n``."""
    lr = rank if local_rank is None else local_rank
    want = job.runtime.device
    if job.backend == "nccl":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if lr >= n:
            raise RuntimeError(f"backend='nccl' puts worker {rank} on cuda:{lr} but this machine has {n} "
                               "CUDA GPU(s); NCCL needs one GPU per worker (it refuses two ranks on one "
                               "device). Use backend='gloo' with device='cuda' to share a GPU")
        return torch.device("cuda", lr)
    if want is None or want == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(f"device={want!r} but torch.cuda.is_available() is False in worker {rank}")
    if want == "cuda":
        return torch.device("cuda", lr % torch.cuda.device_count())
    return torch.device(want)


def open_comm(job: Job, worker: Worker, rank: int, device: torch.device, groups: dict[int, Any], mode: str,
              orders: Any, carried: Callable[[Any], bool]) -> DistComm:
    """This worker's transport (a collective: every rank calls it): point-to-point messages through
    shared memory (:class:`~pipelab.runtime.shm.ShmComm`) where it works (gloo, CPU stages, every worker
    on this host, room for the rings) unless ``job.runtime.shared_memory`` is False; else over the
    process group, one lane per direction."""
    through_host = device.type == "cuda" and job.backend != "nccl"
    asked = job.runtime.shared_memory
    if (asked or (asked is None and device.type == "cpu")) and not job.groups:
        incoming: dict[int, list[Any]] = {}
        for i in range(len(worker.actions)):
            for r in worker.recvs(i):
                if r.src != rank:
                    incoming.setdefault(r.src, []).append(r.specs)
        reason = shm.unusable(job.world_size, shm.ring_bytes(incoming), job.backend)
        if reason is None:
            sends, _ = peer_orders(job.schedule, rank, carried)
            outgoing = sorted(d for d, seq in sends.items() if d != rank and seq)
            return shm.ShmComm.open(rank, job.world_size, device, groups, incoming, outgoing,
                                    timeout=job.timeout, match=mode, orders=orders, through_host=through_host)
        if asked:
            raise RuntimeError(f"shared_memory=True, but {reason}; leave it out to use gloo's point-to-point "
                               "path")
    lanes = None
    if job.backend == "gloo":   # one process group per direction (see pipelab.runtime.comm, "Lanes")
        world = list(range(job.world_size))
        lanes = (dist.new_group(world), dist.new_group(world))
    return DistComm(rank, device, groups, match=mode, orders=orders, through_host=through_host, lanes=lanes)


def run_distributed(job: Job, rank: int, sink: Any, *, init_method: str | None = None,
                    local_rank: int | None = None, gather: bool = False,
                    wsp_conn: Any = None, match: str | None = None) -> tuple[WorkerResult, list[Any]]:
    """Join the process group and run this rank's actions; its result and (``gather``) rank 0's all."""
    mode = p2p_match(job.backend, match)
    device = _join_group(job, rank, local_rank, init_method)
    comm: Any = None
    try:
        w, idx = job.member(rank)     # this process's schedule worker and its index in the tensor group
        syncs = [job.syncs(s) for s in range(job.schedule.num_stages)]
        groups = replica_groups(job.groups, job.schedule.stage_ranks, syncs, rank)
        tensor_pg = make_groups(job.groups, rank) if job.groups else None
        members = job.groups[w] if job.groups else (w,)
        grp = Group(idx, len(members), tensor_pg) if len(members) > 1 else None
        groups.update(tie_process_groups(job.groups, job.ties, rank))   # shared parameters, per shard
        worker, clients = _make_worker(job, w, device, sink, wsp_conn, tensor=grp, process_rank=rank)

        def carried(msg: Any) -> bool:   # a cut with no floating-point value sends no gradient
            return bool(msg.kind == "act" or grad_specs(job.specs[msg.stage - 1]))

        orders = peer_orders(job.schedule, w, carried) if mode == "order" else None
        comm = open_comm(job, worker, rank, device, groups, mode, orders, carried)
        if grp is not None:
            comm = GroupComm(comm, tensor_pg, members[0], idx == 0)
        # a tensor group member's events are its own process's: the trace keeps them apart
        emit = sink.emit if idx == 0 else functools.partial(_as_process, sink, rank)
        torch.set_rng_state(worker.rng_state)
        if worker.meter is not None:
            worker.meter.messages = comm.held
            if device.type == "cuda":   # this process's allocator serves this worker alone
                worker.meter.use_cuda(device)
        if device.type == "cuda":
            torch.cuda.manual_seed(job.seed * 1_000_003 + rank + 1)
        clock = _common_clock(job, device)
        try:
            execute(worker, comm, clock, emit)
        except BaseException:
            a = worker.current
            sink.error(a.stage if a else -1, str(a) if a else "start-up", traceback.format_exc())
            raise
        for c in clients[:1]:    # one pipe per worker
            c.stop()
        dist.barrier()
        result = worker.result()
        result.transport = "shared memory" if isinstance(comm, shm.ShmComm) else job.backend
        return result, (_gather(result, sink, rank, job.world_size) if gather else [])
    except BaseException:    # reported before the teardown below, so the parent reads the cause first
        sink.error(-1, "start-up", traceback.format_exc())
        raise
    finally:
        if comm is not None and hasattr(comm, "close"):
            comm.close()
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def _join_group(job: Job, rank: int, local_rank: int | None, init_method: str | None) -> torch.device:
    """Set up this process (one thread, malloc, device or pinned core), join the group; its device."""
    torch.set_num_threads(1)
    tune_malloc()
    world = job.world_size
    device = stage_device(job, rank, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:   # before the process group starts its I/O threads, which inherit the core
        local_workers = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if local_rank is not None else world
        pin_worker(rank if local_rank is None else local_rank, local_workers, job.runtime.pin_cores)
    timeout = timedelta(seconds=job.timeout)
    if init_method is None:   # the launcher's store (pipelab.runtime.lifeline.Rendezvous)
        store = dist.TCPStore(job.master_addr, job.master_port, world_size=world, is_master=False,
                              timeout=timeout)
        dist.init_process_group(job.backend, store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group(job.backend, init_method=init_method, rank=rank, world_size=world,
                                timeout=timeout)
    return device


def _as_process(sink: Any, rank: int, ev: Event) -> None:
    """Emit ``ev`` as process ``rank``'s (a tensor group member's copy of its worker's action)."""
    sink.emit(dataclasses.replace(ev, worker=rank))


def _make_worker(job: Job, rank: int, device: torch.device, sink: Any, wsp_conn: Any, *,
                 tensor: Any = None, process_rank: int | None = None) -> tuple[Worker, list[Any]]:
    """Schedule worker ``rank``'s Worker reporting to ``sink``, and its parameter-server clients (HetPipe);
    ``tensor``: this process's place in the worker's tensor group."""
    worker = Worker(job, rank, device, tensor=tensor, process_rank=process_rank)
    worker.warn = getattr(sink, "warn", worker.warn)
    if hasattr(sink, "saved"):
        worker.on_saved = sink.saved
    clients: list[Any] = []
    if wsp_conn is not None:
        def endpoint(stage: int, vw: int) -> Any:
            clients.append(WSPClient(wsp_conn, stage, vw, timeout=job.timeout, device=device))
            return clients[-1]
        worker.attach_wsp(endpoint)
    return worker, clients


def _common_clock(job: Job, device: torch.device) -> Clock:
    """A clock whose zero is rank 0's time after every rank is ready (a collective)."""
    dist.barrier()
    t0 = torch.tensor([time.time()], dtype=torch.float64, device=device if job.backend == "nccl" else "cpu")
    dist.broadcast(t0, src=0)
    return Clock(float(t0.item()))


def _gather(result: WorkerResult, sink: Any, rank: int, world: int) -> list[Any]:
    """On rank 0 every rank's ``(result, events)`` (torchrun), else ``[]``; a collective."""
    everything: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object((result, getattr(sink, "events", [])), everything if rank == 0 else None, dst=0)
    # every rank past the gather before any tears its group down (gloo's teardown aborts otherwise)
    dist.barrier()
    return everything


def process_main(job: Job, rank: int, conn: Any, wsp_conn: Any = None, match: str | None = None,
                 stream: bool = True) -> None:
    """Entry point of a spawned worker (``conn``: its pipe); ends with ``os._exit``, or with its launcher."""
    watch_launcher()
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent decides; it cancels the whole job
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    use_loopback()
    torch.set_num_threads(1)
    sink = PipeSink(conn, rank) if stream else PipeSink(conn, rank, batch=sys.maxsize, every_s=math.inf)
    code = 0
    try:
        result, _ = run_distributed(job, rank, sink, wsp_conn=wsp_conn, match=match)
        sink.done(result)
    except BaseException:
        sink.error(-1, "start-up", traceback.format_exc())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
