"""Start a job: one OS process per worker (torch.multiprocessing: fork server, else spawn), or the
reference executor.

:func:`launch` checks the arguments (:func:`pipelab.runtime.job.prepare`), starts the workers and
returns a :class:`Run` handle at once; :func:`train` launches and waits with a progress bar.
Workers stream their events to the parent through a multiprocessing queue while they run, so
``Run.events`` yields them live (a notebook's live Gantt chart reads it).

Faults end the whole job: when a worker raises, the parent receives its traceback, kills every
worker of the job and raises :class:`WorkerError` naming the rank, stage and action. ``cancel()``,
Ctrl-C (KeyboardInterrupt) in ``train``/``wait`` and the ``timeout`` do the same. Workers ignore
SIGINT themselves and ask the kernel to kill them if the parent dies, so none outlives the job.
"""

from __future__ import annotations

import io
import queue as queue_mod
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import pipelab.methods as methods
import pipelab.metrics as metrics
from pipelab._display import Described
from pipelab.graph import StageModule, trace
from pipelab.partition.plan import Plan
from pipelab.runtime.checkpoint import global_weights
from pipelab.runtime.job import Job, prepare
from pipelab.runtime.local import run_local
from pipelab.runtime.process import p2p_match, process_main
from pipelab.runtime.worker import WorkerResult
from pipelab.runtime.wsp import serve_process_main
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
    weight_bytes: dict[int, int] = field(
        default_factory=dict
    )  # per stage: peak bytes of weights held (measured)
    wsp_log: list[Any] = field(default_factory=list)   # hetpipe: the parameter server's pushes and pulls
    # measure_memory=True (pipelab.runtime.memory), per worker: the peak (the CUDA allocator's
    # max_memory_allocated in a CUDA worker process, else the bytes of the storages held), the
    # storage count's peak, the same without message buffers (what the simulator's memory model counts:
    # weights, gradients, optimizer state, activations), its parts at the peak, and (action index,
    # bytes held) after each action
    peak_memory: dict[int, int] = field(default_factory=dict)
    peak_held: dict[int, int] = field(default_factory=dict)
    peak_state: dict[int, int] = field(default_factory=dict)
    memory_breakdown: dict[int, dict[str, int]] = field(default_factory=dict)
    memory_timeline: dict[int, list[tuple[int, int]]] = field(default_factory=dict, repr=False)
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
        lines = [f"trained {self.schedule.method} on plan {m.get('config', '?')} ({m.get('backend', '?')}): "
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
    tr = Trace.from_events(events, method=sched.method, config=job.plan.config, backend=job.backend,
                           microbatches=job.microbatches, minibatches=job.steps, batch_size=job.batch_size,
                           stage_ranks=[list(r) for r in sched.stage_ranks])
    state: dict[str, torch.Tensor] = {}
    losses = [0.0] * job.steps
    held: dict[int, int] = {}
    wbytes: dict[int, int] = {}
    for r in sorted(results, key=lambda r: r.rank):
        for s, n in r.weight_bytes.items():
            wbytes[int(s)] = max(wbytes.get(int(s), 0), int(n))
        state.update(r.state)
        for k, v in r.losses.items():
            losses[int(k)] += v
        for s, n in r.versions_held.items():
            held[int(s)] = max(held.get(int(s), 0), int(n))
    memory: dict[str, Any] = {}
    if job.runtime.measure_memory:
        ranked = sorted(results, key=lambda r: r.rank)
        memory = {"peak_memory": {r.rank: r.peak_memory for r in ranked},
                  "peak_held": {r.rank: r.peak_held for r in ranked},
                  "peak_state": {r.rank: r.peak_state for r in ranked},
                  "memory_breakdown": {r.rank: dict(r.memory_breakdown) for r in ranked},
                  "memory_timeline": {r.rank: list(r.memory_timeline) for r in ranked}}
    expected = job.state_keys or tuple(state)
    missing = [k for k in expected if k not in state]
    if missing:
        raise RuntimeError(f"weights {missing[:5]} were not returned by any stage; is a parameter shared "
                           "between stages? (tied weights across stages are not supported)")
    state = {k: state[k] for k in expected}
    wsp_log = [e for r in results for e in r.wsp_log]
    if wsp_log:   # HetPipe: the parameter server's pushes and pulls join the trace (clock, global clock)
        ranks = sched.stage_ranks
        extra = [
            Event(
                worker=ranks[e.stage][e.vw],
                stage=e.stage,
                kind=e.kind,
                microbatch=e.clock,
                start_s=e.t,
                end_s=e.t,
                weight_version=e.global_clock,
            )
            for e in wsp_log
        ]
        tr = Trace(tuple(tr.events) + tuple(extra), dict(tr.meta))
    thr = metrics.span_throughput(tr.events, job.steps * job.batch_size)
    if trace_path is not None:
        tr.save_jsonl(trace_path)
    return RunResult(trace=tr, losses=losses, throughput=thr, versions_held=held, schedule=sched,
                     wall_s=wall_s, weight_bytes=wbytes, wsp_log=wsp_log, _state=state, **memory)


class Run:
    """A running job: ``.events`` (live), ``.done``, ``.wait()``, ``.cancel()``, ``.pids``."""

    def __init__(self, job: Job, *, trace_path: str | Path | None = None, progress: bool = False,
                 stream: bool = True) -> None:
        self.job = job
        self.stream = stream
        self.trace_path = trace_path
        self._events: list[Event] = []
        self._cond = threading.Condition()
        self._finished = False
        self._error: BaseException | None = None
        self._result: RunResult | None = None
        self._cancel = threading.Event()
        self._procs: list[Any] = []
        self._t0 = time.time()
        self._bar = _progress_bar(job.steps, progress)
        self._last_stage_steps: set[int] = set()
        if job.backend == "local":
            self._thread = threading.Thread(target=self._run_local, daemon=True, name="pipelab-local")
        else:
            self._start_processes()
            self._thread = threading.Thread(target=self._monitor, daemon=True, name="pipelab-monitor")
        self._thread.start()

    # ------------------------------------------------------------------ public
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
        """Block until the job ends; return its result or raise :class:`WorkerError`.

        Ctrl-C while waiting cancels the job (every worker is killed) and re-raises.
        """
        try:
            deadline = None if timeout is None else time.time() + timeout
            while self._thread.is_alive():
                self._thread.join(0.2)
                if deadline is not None and time.time() > deadline:
                    raise TimeoutError(
                        f"the job is still running after {timeout} s (it continues; cancel() it)"
                    )
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

    # ------------------------------------------------------------------ internals
    def _add(self, evs: list[Event]) -> None:
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
            results = run_local(self.job, emit, should_stop=self._cancel.is_set)
            self._add(buf)
            self._result = assemble(self.job, self._events, results, time.time() - self._t0, self.trace_path)
            self._end()
        except KeyboardInterrupt:
            self._fail(WorkerError("the job was cancelled"))
        except BaseException as exc:   # the reference executor's errors surface unchanged
            self._fail(exc)

    def _start_processes(self) -> None:
        import torch.multiprocessing as mp


        # A fork server imports torch (and torch._dynamo, which the first optimizer pulls in: seconds)
        # once per parent process; every later job forks its workers from it at once. Spawn where
        # there is no fork server (not POSIX).
        ctx: Any
        if "forkserver" in mp.get_all_start_methods():
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["pipelab.runtime.process", "torch._dynamo"])
        else:
            ctx = mp.get_context("spawn")
        self._queue = ctx.Queue()
        conns: list[Any] = [None] * self.job.world_size
        match = p2p_match(self.job.backend)   # read here: a fork server keeps the environment it started with
        try:
            if methods.get(self.job.method).weights == "wsp":   # HetPipe: start the parameter server
                conns = self._start_wsp_server(ctx)
            for rank in range(self.job.world_size):
                p = ctx.Process(
                    target=process_main,
                    args=(self.job, rank, self._queue, conns[rank], match, self.stream),
                    daemon=True,
                    name=f"pipelab-worker-{rank}",
                )
                p.start()
                self._procs.append(p)
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
        self._wsp_proc = srv
        return [a for a, _ in pairs]

    def _kill(self) -> None:
        wsp_proc = getattr(self, "_wsp_proc", None)
        if wsp_proc is not None and wsp_proc.is_alive():
            wsp_proc.terminate()
            wsp_proc.join(3)
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        deadline = time.time() + 3
        for p in self._procs:
            p.join(max(0.0, deadline - time.time()))
            if p.is_alive():
                p.kill()
                p.join(5)

    def _died_silently(self, exclude: int, results: dict[int, WorkerResult],
                       wait_s: float = 2.0) -> tuple[int, int] | None:
        """A worker other than ``exclude`` that ended by a signal or a hard crash (not the exit code 1
        of a reported error), waiting up to ``wait_s`` for its exit to show: ``(rank, exit code)``."""
        deadline = time.time() + wait_s
        while True:
            for rank, p in enumerate(self._procs):
                code = p.exitcode
                if rank != exclude and rank not in results and code is not None and code not in (0, 1):
                    return rank, code
            if time.time() > deadline:
                return None
            time.sleep(0.05)

    def _monitor(self) -> None:
        results: dict[int, WorkerResult] = {}
        world = self.job.world_size
        deadline = self._t0 + self.job.timeout
        dead_since: dict[int, float] = {}
        try:
            while len(results) < world:
                if self._cancel.is_set():
                    return
                try:
                    msg = self._queue.get(timeout=0.2)
                except queue_mod.Empty:
                    msg = None
                if msg is not None:
                    kind, rank, payload = msg
                    if kind == "events":
                        self._add(list(payload))
                    elif kind == "done":
                        results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
                    elif kind == "error":
                        stage, action, tb = payload
                        dead = self._died_silently(exclude=rank, results=results)
                        self._kill()
                        if dead is not None:   # the error is a peer noticing the dead one: name the dead
                            d_rank, code = dead
                            self._fail(WorkerError(
                                f"worker {d_rank} died with exit code {code}{_signal_name(code)} without "
                                f"reporting an error (killed, or out of memory); worker {rank} noticed it "
                                f"({action}):\n{tb}", rank=d_rank, worker_traceback=tb))
                            return
                        where = f"stage {stage}, action {action}" if stage >= 0 else action
                        self._fail(
                            WorkerError(
                                f"worker {rank} ({where}) failed:\n{tb}",
                                rank=rank,
                                stage=stage,
                                action=action,
                                worker_traceback=tb,
                            )
                        )
                        return
                    continue
                now = time.time()
                for rank, p in enumerate(self._procs):
                    if rank not in results and p.exitcode is not None:
                        # give its last message time to arrive before calling it a silent death
                        if now - dead_since.setdefault(rank, now) > 2.0:
                            self._kill()
                            self._fail(
                                WorkerError(
                                    f"worker {rank} exited with code {p.exitcode}{_signal_name(p.exitcode)} "
                                    "without reporting an error: killed, out of memory, or it could not "
                                    "start. Run from a "
                                    "script? Worker "
                                    "processes re-import it, so put the call under "
                                    '`if __name__ == "__main__":`',
                                    rank=rank,
                                )
                            )
                            return
                if now > deadline:
                    self._kill()
                    self._fail(
                        WorkerError(
                            f"the job did not finish within timeout={self.job.timeout} s; every "
                            "worker was stopped (raise timeout= for longer runs)"
                        )
                    )
                    return
            if getattr(self, "_wsp_proc", None) is not None and self._wsp_result.poll(30):
                results[0].wsp_log = self._wsp_result.recv()
            for p in self._procs:
                p.join(10)
            self._kill()
            self._result = assemble(self.job, self._events, list(results.values()), time.time() - self._t0,
                                    self.trace_path)
            self._end()
        except BaseException as exc:
            self._kill()
            self._fail(exc)


def _signal_name(code: int) -> str:
    """`` (SIGKILL)`` for a process ended by a signal (a negative exit code), else ``""``."""
    if code >= 0:
        return ""
    import signal

    try:
        return f" ({signal.Signals(-code).name})"
    except ValueError:
        return ""


def _progress_bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="train", unit="step")


def launch(model_fn: Callable[[], torch.nn.Module], plan: Plan, *, method: str | None = None,
           data: Callable[[], Iterable[Any]], loss_fn: Callable[[Any, Any], torch.Tensor],
           optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer], steps: int,
           microbatches: int | None = None, backend: str = "gloo", seed: int = 0, timeout: float = 300.0,
           trace_path: str | Path | None = None, progress: bool = False, schedule: Schedule | None = None,
           port: int | None = None, stream: bool = True, **method_options: Any) -> Run:
    """Start a training job and return its :class:`Run` handle at once (see :func:`train`).

    A ``schedule`` given is checked for per-pair message order first (the validator's rule,
    :func:`pipelab.schedules.validate.check_message_order`), so a schedule that in-order matching
    (NCCL, the tag-blind transport) cannot run fails here with the validator's error, not a hang."""
    if schedule is not None:
        check_message_order(schedule)
    job = prepare(model_fn, plan, method=method, data=data, loss_fn=loss_fn, optimizer=optimizer, steps=steps,
                  microbatches=microbatches, backend=backend, seed=seed, timeout=timeout, schedule=schedule,
                  port=port, **method_options)
    return Run(job, trace_path=trace_path, progress=progress, stream=stream)


def train(model_fn: Callable[[], torch.nn.Module], plan: Plan, *, method: str | None = None,
          data: Callable[[], Iterable[Any]], loss_fn: Callable[[Any, Any], torch.Tensor],
          optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer], steps: int,
          microbatches: int | None = None, backend: str = "gloo", seed: int = 0, timeout: float = 300.0,
          trace_path: str | Path | None = None, progress: bool = True, schedule: Schedule | None = None,
          port: int | None = None, stream: bool = True, **method_options: Any) -> RunResult:
    """Train ``model_fn()`` split by ``plan`` with ``method`` for ``steps`` minibatches; block until done.

    ``data()`` yields ``(inputs, targets)`` minibatches (deterministically: every worker iterates
    it); ``loss_fn(outputs, targets)`` returns the mean loss; ``optimizer(params)`` builds the
    optimizer of one stage (e.g. ``functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)``).
    Each minibatch is split into ``microbatches`` (default: one per stage, :mod:`pipelab.batching`).
    ``backend`` is ``"gloo"`` (CPU processes), ``"nccl"`` (one GPU per worker) or ``"local"`` (the
    single-process reference executor).
    The schedule is ``pl.schedules.build(method, plan, microbatches=..., minibatches=steps,
    **method_options)`` unless ``schedule`` is given. ``stream=False`` makes each worker process keep
    its events and send them once, when it ends (no live view, no progress until then; the trace is the
    same). Raises :class:`WorkerError` if a worker fails.
    """
    run = launch(
        model_fn,
        plan,
        method=method,
        data=data,
        loss_fn=loss_fn,
        optimizer=optimizer,
        steps=steps,
        microbatches=microbatches,
        backend=backend,
        seed=seed,
        timeout=timeout,
        trace_path=trace_path,
        progress=progress,
        schedule=schedule,
        port=port,
        stream=stream,
        **method_options,
    )
    return run.wait()
