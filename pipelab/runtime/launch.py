"""Start a job: one OS process per worker (fork server, else spawn), or the reference executor.

Invariant: a fault ends the whole job. The first error (or a silent death, seen as EOF on its pipe)
is raised as a :class:`WorkerError` naming rank, stage and action, and every worker is killed;
``cancel()``, Ctrl-C and ``timeout`` do the same. The run holds its checkpoint folder locked.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import torch

import pipelab.methods as methods
import pipelab.metrics as metrics
from pipelab._display import Described
from pipelab.graph import StageModule, trace
from pipelab.partition.plan import Plan
from pipelab.runtime.args import TrainArgs, describe_fields, signature
from pipelab.runtime.checkpoint_files import FolderLock, global_weights
from pipelab.runtime.checkpoint_files import clean as clean_checkpoints
from pipelab.runtime.job import Job, prepare
from pipelab.runtime.lifeline import MAIN_GUARD_HINT, Rendezvous, signal_name
from pipelab.runtime.local import run_local
from pipelab.runtime.param_server import serve_process_main
from pipelab.runtime.process import p2p_match, process_main
from pipelab.runtime.tensor_group import join_states
from pipelab.runtime.ties import copies_equal
from pipelab.runtime.worker import WorkerResult
from pipelab.runtime.worker_checkpoint import sealer_for
from pipelab.schedules.actions import Schedule
from pipelab.schedules.validate import check_message_order
from pipelab.trace import Event, Trace


class WorkerError(RuntimeError):
    """A worker failed (or the job was cancelled / timed out); the message holds its traceback."""

    def __init__(self, message: str, *, rank: int = -1, stage: int = -1, action: str = "",
                 worker_traceback: str = "") -> None:
        super().__init__(message)
        self.rank, self.stage, self.action, self.worker_traceback = rank, stage, action, worker_traceback


@dataclass(repr=False)
class RunResult(Described):
    """What a finished run returns."""

    trace: Trace
    losses: list[float]                   # per minibatch (step): mean of its microbatch losses
    throughput: float                     # samples/s between the first action's start and the last's end
    versions_held: dict[int, int]         # per stage: most weight versions it held at once (measured)
    schedule: Schedule
    wall_s: float = 0.0
    weight_bytes: dict[int, int] = field(default_factory=dict)   # per stage: peak bytes of weights held
    wsp_log: list[Any] = field(default_factory=list)   # hetpipe: the parameter server's pushes and pulls
    transport: str = "in process"         # how messages travelled: "shared memory", "gloo", "nccl"
    # measure_memory=True, per worker (pipelab.runtime.memory): the peak, the storage count's peak, it
    # without messages (the simulator's terms), its parts at the peak, (action, bytes) after each action
    peak_memory: dict[int, int] = field(default_factory=dict)
    peak_held: dict[int, int] = field(default_factory=dict)
    peak_state: dict[int, int] = field(default_factory=dict)
    memory_breakdown: dict[int, dict[str, int]] = field(default_factory=dict)
    memory_timeline: dict[int, list[tuple[int, int]]] = field(default_factory=dict, repr=False)
    #: a tensor group's other members' events (worker = their process rank; ``trace.meta["tensor_groups"]``)
    member_events: list[Event] = field(default_factory=list, repr=False)
    _state: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def steady_throughput(self) -> float:
        """Samples/s between minibatch completions, the first and last left out (``Trace.steady_window``)."""
        try:
            return self.trace.steady_throughput()
        except (ValueError, ZeroDivisionError):
            return self.throughput

    @property
    def startup_s(self) -> float:
        """Seconds of the run's wall time outside its actions: process start, rendezvous, the first calls."""
        return max(0.0, self.wall_s - self.trace.makespan)

    def describe(self) -> str:
        """What ran, the steady-state rate with the start-up apart, and the loss."""
        m = self.trace.meta
        K, M, B = len(self.losses), int(m.get("microbatches", 1)), m.get("batch_size", "?")
        how = str(m.get("backend", "?"))
        if self.transport not in ("in process", how):
            how += f", messages through {self.transport}"
        lines = [f"trained {self.schedule.method} on plan {m.get('config', '?')} ({how}): "
                 f"{K} minibatches of {B} samples, M={M} microbatches",
                 f"  steady state {self.steady_throughput:,.0f} samples/s (between minibatch completions, "
                 f"the first and last left out); first action to last {self.throughput:,.0f} samples/s",
                 f"  wall {self.wall_s:.1f} s, of which start-up {self.startup_s:.1f} s (processes, "
                 f"rendezvous) and {self.trace.makespan:.2f} s training"]
        if self.losses:
            lines.append(f"  loss {self.losses[0]:.4f} -> {self.losses[-1]:.4f}")
        return "\n".join(lines)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's final weights, keys as in ``model_fn().state_dict()`` (copies)."""
        return {k: v.clone() for k, v in self._state.items()}


def assemble(job: Job, events: Iterable[Event], results: list[WorkerResult], wall_s: float,
             trace_path: str | Path | None = None) -> RunResult:
    """Combine the workers' results and events into a :class:`RunResult` (and save the trace)."""
    sched = job.schedule
    events = list(events)
    W = sched.num_workers
    meta: dict[str, Any] = {}
    if job.groups:    # tensor groups: their process ranks, and the members' own copies of the actions
        meta = {"tensor_groups": [list(g) for g in job.groups],
                "tensor_degrees": [int(s.tensor) for s in job.plan.stages]}
    tr = Trace.from_events([e for e in events if e.worker < W], method=sched.method, config=job.plan.config,
                           backend=job.backend, microbatches=job.microbatches, minibatches=job.steps,
                           batch_size=job.batch_size, stage_ranks=[list(r) for r in sched.stage_ranks],
                           **meta)
    member_events = [e for e in events if e.worker >= W]
    shards: dict[int, dict[str, torch.Tensor]] = {}
    dims: dict[int, dict[str, int]] = {}
    losses = [0.0] * job.steps
    held: dict[int, int] = {}
    wbytes: dict[int, int] = {}
    for r in sorted(results, key=lambda r: r.rank):
        for s, n in r.weight_bytes.items():
            wbytes[int(s)] = max(wbytes.get(int(s), 0), int(n))
        pr = r.process_rank if r.process_rank >= 0 else r.rank
        shards[pr], dims[pr] = r.state, r.shard_dims
        for k, v in r.losses.items():
            losses[int(k)] += v
        for s, n in r.versions_held.items():
            held[int(s)] = max(held.get(int(s), 0), int(n))
    memory: dict[str, Any] = {}
    if job.runtime.measure_memory:
        memory = {k: {r.rank: copy.copy(getattr(r, k)) for r in sorted(results, key=lambda r: r.rank)}
                  for k in ("peak_memory", "peak_held", "peak_state", "memory_breakdown", "memory_timeline")}
    state = join_states(shards, dims, job.groups)
    expected = job.state_keys or tuple(state)
    missing = [k for k in expected if k not in state]
    if missing:
        raise RuntimeError(f"weights {missing[:5]} were not returned by any stage (a stage module that "
                           "does not hold a weight of model_fn()'s state_dict); this is a bug")
    diverged = copies_equal(state, [g.tie for g in job.ties])
    if diverged:   # the tie rule keeps them bit-identical (pipelab.runtime.ties): never silently untied
        raise RuntimeError(f"the copies of shared parameter(s) {diverged} differ between stages at the end "
                           "of the run: one holding stage skipped an update the other applied "
                           "(on_nonfinite='skip'), or this is a bug in pipelab.runtime.ties")
    state = {k: state[k] for k in expected}
    wsp_log = [e for r in results for e in r.wsp_log]
    if wsp_log:   # HetPipe: the parameter server's pushes and pulls join the trace (clock, global clock)
        ranks = sched.stage_ranks
        extra = [Event(worker=ranks[e.stage][e.vw], stage=e.stage, kind=e.kind, microbatch=e.clock,
                       start_s=e.t, end_s=e.t, weight_version=e.global_clock) for e in wsp_log]
        tr = Trace(tuple(tr.events) + tuple(extra), dict(tr.meta))
    thr = metrics.span_throughput(tr.events, job.steps * job.batch_size)
    if trace_path is not None:
        tr.save_jsonl(trace_path)
    return RunResult(trace=tr, losses=losses, throughput=thr, versions_held=held, schedule=sched,
                     wall_s=wall_s, weight_bytes=wbytes, wsp_log=wsp_log, _state=state,
                     member_events=member_events,
                     transport=min(results, key=lambda r: r.rank).transport, **memory)


class Run:
    """A running job: ``.events`` (live), ``.done``, ``.wait()``, ``.cancel()``, ``.pids``."""

    def __init__(self, job: Job, *, trace_path: str | Path | None = None, progress: bool = False,
                 stream: bool = True) -> None:
        self.job = job
        self.stream = stream
        self.trace_path = trace_path
        self._events: list[Event] = []
        self._member_events: list[Event] = []
        self._cond = threading.Condition()
        self._finished = False
        self._error: BaseException | None = None
        self._result: RunResult | None = None
        self._cancel = threading.Event()
        self._expired = False
        self._procs: list[Any] = []
        self._wsp_proc: Any = None    # HetPipe's parameter server
        self._conns: list[Any] = []
        self._locks: list[FolderLock] = []
        self._rendezvous: Rendezvous | None = None
        self._timer: threading.Timer | None = None
        self._t0 = time.time()
        self._bar: Any = None
        if progress:
            with contextlib.suppress(ImportError):
                from tqdm.auto import tqdm

                self._bar = tqdm(total=job.steps, desc="train", unit="step")
        self._last_stage_steps: set[int] = set()
        self._take_checkpoint_folders()
        try:
            self._sealer = sealer_for(job)
            if job.backend == "local":
                self._thread = threading.Thread(target=self._run_local, daemon=True, name="pipelab-local")
            else:
                self._start_processes()
                self._thread = threading.Thread(target=self._monitor, daemon=True, name="pipelab-monitor")
                # a timer outside the monitor's reads: it kills the workers, so no read outlasts it
                self._timer = threading.Timer(max(0.0, self._t0 + job.timeout - time.time()), self._expire)
                self._timer.daemon = True
                self._timer.start()
        except BaseException:
            self._release()
            raise
        self._thread.start()

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (empty for the local backend)."""
        return [p.pid for p in self._procs if p.pid is not None]

    @property
    def done(self) -> bool:
        """Whether the job has ended (finished, failed or cancelled)."""
        return self._finished

    @property
    def events(self) -> Iterator[Event]:
        """Every event so far, then each new one as it arrives, until the job ends."""
        i = 0
        while True:
            with self._cond:
                while i >= len(self._events) and not self._finished:
                    self._cond.wait(0.5)
                batch = self._events[i:]
                finished = self._finished
            yield from batch
            i += len(batch)
            if finished and i >= len(self._events):
                return

    def events_so_far(self) -> list[Event]:
        """A snapshot of the events received so far (non-blocking)."""
        with self._cond:
            return list(self._events)

    def wait(self, timeout: float | None = None) -> RunResult:
        """Block until the job ends; return its result or raise :class:`WorkerError` (Ctrl-C while
        waiting cancels the job, every worker killed, and re-raises)."""
        try:
            deadline = None if timeout is None else time.time() + timeout
            while self._thread.is_alive():
                self._thread.join(0.2)
                if deadline is not None and time.time() > deadline:
                    raise TimeoutError(f"the job is still running after {timeout} s "
                                       "(it continues; cancel() it)")
        except KeyboardInterrupt:
            self.cancel()
            raise
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        """Stop the job now: kill every worker process; ``wait()`` then raises :class:`WorkerError`."""
        self._cancel.set()
        self._kill()
        self._thread.join(10)
        if not self._finished:
            self._fail(WorkerError("the job was cancelled"))

    def _take_checkpoint_folders(self) -> None:
        """Lock the checkpoint folder (and the one resumed from) for the run; clean what a killed run left."""
        rt = self.job.runtime
        roots = []
        if rt.checkpoint_dir is not None:
            roots.append(Path(rt.checkpoint_dir).resolve())
        if rt.resume is not None:
            roots.append(Path(rt.resume).resolve().parent)
        try:
            for root in dict.fromkeys(roots):
                self._locks.append(FolderLock(root))
            if rt.checkpoint_dir is not None:
                clean_checkpoints(rt.checkpoint_dir)
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        """Give back what the run holds: the folder locks, the rendezvous, the deadline timer."""
        if self._timer is not None:
            self._timer.cancel()
        for lock in self._locks:
            lock.release()
        self._locks = []
        if self._rendezvous is not None:
            self._rendezvous.close()
            self._rendezvous = None

    def _add(self, evs: list[Event]) -> None:
        W = self.job.schedule.num_workers
        if any(e.worker >= W for e in evs):    # tensor group members: kept apart from the schedule's rows
            self._member_events.extend(e for e in evs if e.worker >= W)
            evs = [e for e in evs if e.worker < W]
        with self._cond:
            self._events.extend(evs)
            self._cond.notify_all()
        last = self.job.schedule.num_stages - 1
        for e in evs:
            if e.kind == "U" and e.stage == last and e.microbatch not in self._last_stage_steps:
                self._last_stage_steps.add(e.microbatch)
                if self._bar is not None:
                    self._bar.update(1)

    def _fail(self, err: BaseException) -> None:
        self._error = err
        self._end()

    def _end(self) -> None:
        self._release()
        if self._bar is not None:
            self._bar.close()
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def _run_local(self) -> None:
        buf: list[Event] = []

        def emit(ev: Event) -> None:
            buf.append(ev)
            if len(buf) >= 16:
                self._add(buf[:])
                buf.clear()
        try:
            on_saved = None if self._sealer is None else self._sealer.report
            results = run_local(self.job, emit, should_stop=self._cancel.is_set, on_saved=on_saved)
            self._add(buf)
            self._result = assemble(self.job, self._events, results, time.time() - self._t0, self.trace_path)
            self._end()
        except KeyboardInterrupt:
            self._fail(WorkerError("the job was cancelled"))
        except BaseException as exc:   # the reference executor's errors surface unchanged
            self._fail(exc)

    def _start_processes(self) -> None:
        import torch.multiprocessing as mp

        # a fork server imports torch and torch._dynamo once per parent process; later jobs fork from it
        ctx: Any
        if "forkserver" in mp.get_all_start_methods():
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["pipelab.runtime.process", "torch._dynamo"])
        else:
            ctx = mp.get_context("spawn")
        # the store listens on loopback, on the port it was bound to here (no race with another run)
        self._rendezvous = Rendezvous(self.job.master_addr, self.job.master_port or None, self.job.timeout)
        self.job = dataclasses.replace(self.job, master_port=self._rendezvous.port)
        conns: list[Any] = [None] * self.job.world_size
        match = p2p_match(self.job.backend)   # read here: a fork server keeps the environment it started with
        try:
            if methods.get(self.job.method).weights == "wsp":
                conns = self._start_wsp_server(ctx)
            for rank in range(self.job.world_size):
                r, w = ctx.Pipe(duplex=False)
                p = ctx.Process(target=process_main, daemon=True, name=f"pipelab-worker-{rank}",
                                args=(self.job, rank, w, conns[rank], match, self.stream))
                p.start()
                w.close()    # the worker's end only: its pipe reads EOF once it is gone
                self._procs.append(p)
                self._conns.append(r)
        except BaseException:
            self._kill()
            raise

    def _start_wsp_server(self, ctx: Any) -> list[Any]:
        """HetPipe: start the WSP parameter-server process; returns each worker's end of its pipe."""
        job = self.job
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(job.seed)
            gm = trace(job.model_fn(), **job.trace_kwargs)
        shards = {s: {n: p.detach().numpy() for n, p in StageModule(gm, *job.ranges[s]).named_parameters()}
                  for s in range(job.schedule.num_stages)}
        if job.runtime.resume:    # the server restarts from the checkpoint's global weights
            saved = global_weights(job.runtime.resume, plan=job.plan, method=job.method,
                                   stage_ranks=job.schedule.stage_ranks)
            shards = {s: {n: saved[s][n].numpy() for n in shard} for s, shard in shards.items()}
        pairs = [ctx.Pipe() for _ in range(job.world_size)]
        self._wsp_result, res_w = ctx.Pipe(duplex=False)
        srv = ctx.Process(target=serve_process_main, daemon=True, name="pipelab-wsp-server",
                          args=([b for _, b in pairs], shards, len(job.schedule.stage_ranks[0]),
                                int(job.options.get("D", 0)), res_w))
        srv.start()
        res_w.close()
        for _, b in pairs:
            b.close()
        self._wsp_proc = srv
        return [a for a, _ in pairs]

    def _expire(self) -> None:
        """The deadline passed: stop every worker (the monitor then reports the timeout)."""
        if not self._finished:
            self._expired = True
            self._kill()

    def _kill(self) -> None:
        procs = [p for p in (*self._procs, self._wsp_proc) if p is not None]
        for p in procs:
            if p.is_alive():
                p.terminate()
        deadline = time.time() + 1.0   # SIGTERM, then SIGKILL: a stopped or stuck process ignores the first
        for p in procs:
            p.join(max(0.0, deadline - time.time()))
            if p.is_alive():
                p.kill()
                p.join(5)

    def _monitor(self) -> None:
        try:
            results = self._collect()
            if results is None:
                return
            if self._wsp_proc is not None and self._wsp_result.poll(30):
                results[0].wsp_log = self._wsp_result.recv()
            for p in self._procs:
                p.join(10)
            self._kill()
            self._result = assemble(self.job, [*self._events, *self._member_events], list(results.values()),
                                    time.time() - self._t0, self.trace_path)
            self._end()
        except BaseException as exc:
            self._kill()
            self._fail(exc)

    def _collect(self) -> dict[int, WorkerResult] | None:
        """Read every worker's pipe and sentinel until each sent its result (None: a fault ended the job)."""
        results: dict[int, WorkerResult] = {}
        errors: list[tuple[float, int, int, str, str]] = []    # (time raised, rank, stage, action, traceback)
        open_conns: dict[Any, int] = {c: rank for rank, c in enumerate(self._conns)}
        ended: set[int] = set()     # ranks whose pipe is closed
        while len(results) < self.job.world_size:
            if self._cancel.is_set():
                return None
            if self._expired:
                break
            ready: list[Any] = wait(list(open_conns), timeout=0.5)
            for c in ready:
                rank = open_conns[c]
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    del open_conns[c]
                    ended.add(rank)
                    continue
                self._handle(msg, results, errors)
            if self._cancel.is_set():
                return None
            if self._expired:   # the timer killed the workers: not their fault
                break
            if errors or any(r not in results for r in ended):
                # a fault: what is already in the pipes came before it; read it all, then name the cause
                self._drain(open_conns, results, errors, ended)
                self._kill()
                self._fail(self._cause(errors, results, ended))
                return None
        if self._expired or len(results) < self.job.world_size:
            self._kill()
            self._fail(WorkerError(f"the job did not finish within timeout={self.job.timeout} s; every "
                                   "worker was stopped (raise timeout= for longer runs)"))
            return None
        return results

    def _handle(self, msg: Any, results: dict[int, WorkerResult], errors: list[Any]) -> None:
        kind, rank, payload = msg
        if kind == "events":
            self._add(list(payload))
        elif kind == "done":
            results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
        elif kind == "error":
            stage, action, tb, t = payload
            errors.append((t, rank, stage, action, tb))
        elif kind == "saved" and self._sealer is not None:
            step, sha = payload
            self._sealer.report(step, rank, sha)
        elif kind == "warning":
            warnings.warn(f"worker {rank}: {payload}", RuntimeWarning, stacklevel=1)

    def _drain(self, open_conns: dict[Any, int], results: dict[int, WorkerResult], errors: list[Any],
               ended: set[int], quiet_s: float = 0.2) -> None:
        """Read whatever the workers have already written, until the pipes are quiet for ``quiet_s``."""
        end = time.time() + 2.0
        while open_conns and time.time() < end:
            ready: list[Any] = wait(list(open_conns), timeout=quiet_s)
            if not ready:
                return
            for c in ready:
                try:
                    self._handle(c.recv(), results, errors)
                except (EOFError, OSError):
                    ended.add(open_conns.pop(c))

    def _who(self, rank: int) -> str:
        """``worker R``, or for a tensor group's process: its rank, worker and shard."""
        w, i = self.job.member(rank)
        t = len(self.job.groups[w]) if self.job.groups else 1
        return f"worker {rank}" if t == 1 else f"process {rank} (worker {w}'s tensor shard {i} of {t})"

    def _cause(self, errors: list[Any], results: dict[int, WorkerResult], ended: set[int]) -> WorkerError:
        """The first fault: a worker that died without a word, else the error raised first (stamped time)."""
        silent = sorted(ended - {e[1] for e in errors} - set(results))
        first = min(errors, default=None)
        if silent:
            d_rank = silent[0]
            w, i = self.job.member(d_rank)
            stages = list(self.job.schedule.stages_of(w)) if w < self.job.schedule.num_workers else []
            self._procs[d_rank].join(2.0)
            code = -1 if self._procs[d_rank].exitcode is None else int(self._procs[d_rank].exitcode)
            noticed = (f"; {self._who(first[1])} noticed it ({first[3]}):\n{first[4]}" if first is not None
                       else f". {MAIN_GUARD_HINT}")
            where = f"stage {', '.join(map(str, stages))}"
            return WorkerError(f"{self._who(d_rank)} ({where}) died with exit code {code}{signal_name(code)} "
                               "without reporting an error (killed, out of memory, or it could not start)"
                               f"{noticed}",
                               rank=d_rank, worker_traceback=first[4] if first else "")
        assert first is not None
        _, rank, stage, action, tb = first
        where = f"stage {stage}, action {action}" if stage >= 0 else action
        last = tb.strip().splitlines()[-1] if tb.strip() else ""
        return WorkerError(f"{self._who(rank)} ({where}) failed: {last}\n{tb}", rank=rank, stage=stage,
                           action=action, worker_traceback=tb)


def launch(model_fn: Callable[[], torch.nn.Module], plan: Plan, **kw: Any) -> Run:
    """Start a training job and return its :class:`Run` handle at once (arguments as :func:`train`).

    A given ``schedule`` is checked for per-pair message order first, so one that in-order matching
    cannot run fails here rather than hangs.
    """
    args = TrainArgs.of(model_fn=model_fn, plan=plan, **kw)
    return start(args)


def start(args: TrainArgs) -> Run:
    """Prepare the job of ``args`` and start it (``launch`` and ``train`` of the one record)."""
    if args.schedule is not None:
        check_message_order(args.schedule)
    job = prepare(args)
    return Run(job, trace_path=args.trace_path, progress=bool(args.progress), stream=args.stream)


def train(model_fn: Callable[[], torch.nn.Module], plan: Plan, **kw: Any) -> RunResult:
    """Train ``model_fn()`` split by ``plan`` with ``method`` for ``steps`` minibatches; block until done.

    ``data()`` yields ``(inputs, targets)`` minibatches (every worker iterates it); ``loss_fn(outputs,
    targets)`` returns the mean loss; ``optimizer(params)`` builds one stage's optimizer. ``backend``:
    ``"gloo"``, ``"nccl"`` or ``"local"`` (the reference executor). ``schedule`` overrides
    ``schedules.build(method, plan, ...)``; ``stream=False`` sends each worker's events once, at its end.
    Other keywords are the method's and the runtime's options. Raises :class:`WorkerError` if a worker
    fails. The keywords (:class:`pipelab.runtime.args.TrainArgs`, each declared there once):

{fields}
    """
    args = TrainArgs.of(model_fn=model_fn, plan=plan, **kw)
    if args.progress is None:
        args = dataclasses.replace(args, progress=True)
    return start(args).wait()


train.__doc__ = (train.__doc__ or "").replace("{fields}", describe_fields())
launch.__signature__ = signature()  # type: ignore[attr-defined]
train.__signature__ = signature()  # type: ignore[attr-defined]
