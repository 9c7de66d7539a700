"""One worker: builds its stage(s) and executes its action list, in order, exactly as scheduled.

:class:`Worker` is transport-free: for action ``i`` it says which messages it needs
(:meth:`Worker.recvs`), and :meth:`Worker.run` executes an ``F``/``B``/``W`` given those messages
and returns the messages to send; a ``U`` is split into :meth:`Worker.begin_update` (the gradients
to all-reduce) and :meth:`Worker.finish_update`. The multi-process driver (:func:`run_distributed`,
here) and the single-process reference executor (:mod:`pipelab.runtime.local`) move the messages.

Semantics (the same in both executors):

* Every worker seeds torch with the job's seed, calls ``model_fn()`` and cuts its stage(s) out of
  the whole model with :func:`pipelab.graph.build_stage`, so every stage starts from the
  weights the single-process model has.
* Data: the workers of the first and the last stage each iterate the same deterministic
  ``data()`` and slice their own microbatches (inputs on the first stage, targets on the last);
  labels are never sent. Microbatch ``m`` is part ``m % M`` of minibatch ``m // M``.
* Loss: the last stage's ``F`` computes ``loss_fn(output, target) / M``; gradients of the
  microbatches of a minibatch sum, so the minibatch gradient is the same however it is split.
* ``U``: replicas of a stage sum their gradients (all-reduce in the stage's group), divide by the
  number of minibatches the update covers (1 for flushed methods; R for PipeDream's R replicas
  that each closed a different minibatch), then step the optimizer.
* ``B`` computes input and weight gradients, unless the stage has ``W`` actions (zero-bubble): then
  ``B`` computes input gradients only and ``W`` the weight gradients.
* Randomness (dropout): each worker has its own stream seeded from (seed, rank), so a run is
  reproducible and the reference executor (which swaps the streams in) matches the processes.
* Runtime options (:mod:`pipelab.runtime.options`): ``compression`` encodes every message that
  crosses a cut, ``recompute`` keeps only stage inputs and recomputes in backward, ``slowdown``
  sleeps after each action to emulate a slower device, ``coalesce_wgrad`` defers every Linear's
  weight gradient to one GEMM over the minibatch's microbatches at ``U`` (flushed methods only,
  :mod:`pipelab.runtime.coalesce`); ``checkpoint_every``/``checkpoint_dir``
  save every worker's state after each N-th minibatch's last ``U``, at a drained point (asynchronous
  schedules are built as drained segments, :mod:`pipelab.schedules.segments`;
  :meth:`Worker.maybe_checkpoint`), and ``resume`` restores it (:meth:`Worker.restore`); the data
  restart at the checkpoint's step.
* HetPipe: each stage's policy pushes/pulls through a WSP parameter server (:mod:`pipelab.runtime.wsp`),
  a separate process here, in-process shards in the reference executor.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch import nn

from pipelab.graph import StageModule, as_tuple, trace
from pipelab.runtime.comm import (
    ACT,
    GRAD,
    VERSION_SPEC,
    DistComm,
    Recv,
    Send,
    TensorSpec,
    grad_specs,
    tag,
)
from pipelab.runtime.job import Job, as_inputs, split_microbatches
from pipelab.runtime.weights import WeightPolicy, policy_for
from pipelab.schedules.actions import Action

EventTuple = tuple[int, int, str, int, float, float, int, int, int, int]
LOOKAHEAD = 4   # post the receives of this many upcoming actions early


class Feed:
    """This worker's view of ``data()``: minibatch ``k`` split into microbatches, on demand.

    The data is iterated in order (and restarted when exhausted, like epochs); a minibatch whose
    shapes differ from the first one raises, naming it.
    """

    def __init__(self, job: Job, device: torch.device) -> None:
        self.job, self.device = job, device
        self._it: Iterator[Any] | None = None
        self._next = 0
        self._cache: dict[int, tuple[list[Any], list[Any]]] = {}
        self._shapes: Any = None

    def _fetch(self) -> tuple[Any, Any]:
        for _ in range(2):
            if self._it is None:
                self._it = iter(self.job.data())
            try:
                return next(self._it)  # type: ignore[no-any-return]
            except StopIteration:
                self._it = None
        raise ValueError("data() yielded no minibatch")

    def minibatch(self, k: int) -> tuple[list[Any], list[Any]]:
        """Inputs and targets of minibatch ``k``, each split into M microbatches.

        After ``resume=``, minibatch ``k`` of the run is item ``resume_step + k`` of ``data()``.
        """
        k += int(self.job.options.get("resume_step", 0))
        while self._next <= k:
            x, y = self._fetch()
            xs = as_inputs(x)
            shapes = ([tuple(t.shape) for t in xs], _shape_tree(y))
            if self._shapes is None:
                self._shapes = shapes
            elif shapes != self._shapes:
                raise ValueError(f"minibatch {self._next} of data() has shapes {shapes} but the first had "
                                 f"{self._shapes}; every minibatch must have the same shapes (drop the last "
                                 "partial batch)")
            M = self.job.microbatches
            xs = tuple(t.to(self.device) for t in xs)
            parts_x = [tuple(p) for p in zip(*[split_microbatches(t, M) for t in xs])]
            parts_y = split_microbatches(_to(y, self.device), M)
            self._cache[self._next] = (parts_x, parts_y)
            self._cache.pop(self._next - 2, None)
            self._next += 1
        return self._cache[k]

    def inputs(self, m: int) -> tuple[torch.Tensor, ...]:
        """Model inputs of microbatch ``m``."""
        M = self.job.microbatches
        return self.minibatch(m // M)[0][m % M]  # type: ignore[no-any-return]

    def targets(self, m: int) -> Any:
        """Targets of microbatch ``m``."""
        M = self.job.microbatches
        return self.minibatch(m // M)[1][m % M]


def _shape_tree(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return tuple(x.shape)
    if isinstance(x, (tuple, list)):
        return tuple(_shape_tree(v) for v in x)
    return None


def _to(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, device) for v in x)
    return x


@dataclass
class Pending:
    """A microbatch between its ``F`` and its last backward action on a stage."""

    inputs: list[torch.Tensor]
    outputs: tuple[Any, ...]
    version: int
    grad_outputs: list[Any] | None = None      # kept from B for W (split backward)
    grad_targets: list[Any] | None = None


class StageState:
    """One stage hosted by this worker: module, optimizer, weight policy, in-flight microbatches."""

    def __init__(self, job: Job, gm: Any, stage: int, device: torch.device, policy_factory: Any,
                 upcoming: list[int]) -> None:
        start, end = job.ranges[stage]
        self.index = stage
        self.module = StageModule(gm, start, end).to(device)
        self.params: dict[str, nn.Parameter] = dict(self.module.named_parameters())
        trainable = [p for p in self.params.values() if p.requires_grad]
        self.optimizer = job.optimizer(trainable) if trainable else None
        self.policy: WeightPolicy = policy_factory(self.params, stage, upcoming)
        self.is_first = stage == 0
        self.is_last = stage == job.schedule.num_stages - 1
        self.syncs = job.syncs(stage)     # replicas all-reduce gradients at U
        self.pending: dict[int, Pending] = {}
        self.losses: dict[int, torch.Tensor] = {}


class Worker:
    """Executes worker ``rank``'s action list of ``job.schedule`` (transport-free; see module doc)."""

    def __init__(self, job: Job, rank: int, device: torch.device | str = "cpu") -> None:
        self.job, self.rank = job, rank
        self.device = torch.device(device)
        sched = job.schedule
        self.actions: tuple[Action, ...] = sched.actions[rank]
        self.nb = max(sched.num_stages - 1, 1)
        with torch.random.fork_rng(devices=[]):   # the same initial weights as the plain model
            torch.manual_seed(job.seed)
            model = job.model_fn()
        gm = trace(model, **job.trace_kwargs)
        factory = policy_for(sched.method, job.policy_options)
        self.stages: dict[int, StageState] = {}
        for s in sched.stages_of(rank):
            self.stages[s] = StageState(job, gm, s, self.device, factory, self._input_versions(s))
        del model, gm
        self.split = {s: any(a.kind == "W" and a.stage == s for a in self.actions) for s in self.stages}
        self.feed = Feed(job, self.device) if (0 in self.stages or sched.num_stages - 1 in self.stages) else None
        # this worker's own random stream (dropout, ...): the same in a process and in the
        # reference executor, which swaps it in around each of this worker's actions
        self.rng_state = torch.Generator().manual_seed(job.seed * 1_000_003 + rank + 1).get_state()
        self.codec = job.options.get("compression")
        if self.codec in (None, "none"):
            self.codec = None
        self.recompute = bool(job.options.get("recompute", False))
        # coalesce_wgrad: Linears defer their weight gradients to one GEMM at U (pipelab.runtime.coalesce)
        self.coalescers: dict[int, Any] = {}
        if job.options.get("coalesce_wgrad"):
            from pipelab.runtime.coalesce import check_method, install

            check_method(sched.method, any(a.kind == "W" for a in self.actions))
            self.coalescers = {s: install(st.module) for s, st in self.stages.items()}
        self._recvs = [self._needs(a) for a in self.actions]
        self._retire = self._retire_plan()
        self.u_pair, self.u_divisor = self._update_facts()
        self.current: Action | None = None
        # checkpoints: the last U of each minibatch on this worker is where one may be taken
        self.start_step = int(job.options.get("resume_step", 0))
        self._last_u: dict[int, int] = {a.microbatch: i for i, a in enumerate(self.actions) if a.kind == "U"}
        if job.options.get("resume"):
            self.restore(job.options["resume"])

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        """This worker's state at a drained point: per stage weights, optimizer, policy state; its RNG.

        Checkpoints are taken only where nothing is in flight on this worker (after a flushed
        method's minibatch, or an asynchronous schedule's drained segment, see
        :mod:`pipelab.schedules.segments`): every policy then holds one weight version, the master
        weights saved here, so restoring them and the policy's own state (PipeMare's delta and step
        count, HetPipe's anchor) resumes every method exactly. Raises ``RuntimeError`` otherwise.
        """
        stages: dict[int, Any] = {}
        for s, st in self.stages.items():
            busy = sorted(set(st.policy.in_flight) | set(st.pending))
            if busy or st.policy.held != 1:
                raise RuntimeError(f"worker {self.rank} stage {s}: checkpoint requested while microbatches {busy} "
                                   f"are in flight ({st.policy.held} weight versions held); checkpoints need a "
                                   "drained pipeline (asynchronous schedules: build with drain_every=N)")
            anchor = getattr(st.policy, "anchor", None)     # HetPipe: the weights of the last pull
            if anchor is not None and (getattr(st.policy, "pull_pending", False) or not all(
                    torch.equal(anchor[n], p.detach()) for n, p in st.params.items())):
                raise RuntimeError(f"worker {self.rank} stage {s}: HetPipe checkpoint requested between a wave's "
                                   "push and its pull; the saved weights must be the parameter server's")
            stages[s] = {"module": {k: v.detach().cpu().clone() for k, v in st.module.state_dict().items()},
                         "optimizer": st.optimizer.state_dict() if st.optimizer is not None else None,
                         "policy": st.policy.state_dict(), "version": st.policy.latest}
        return {"stages": stages, "rng": torch.get_rng_state()}

    def restore(self, path: Any) -> None:
        """Load this worker's state from the checkpoint at ``path`` (plan and method are checked).

        The schedule of a resumed run numbers its minibatches and weight versions from 0 again;
        the data restart at the checkpoint's step (``Feed`` adds ``resume_step``).
        """
        from pipelab.runtime.checkpoint import load_worker

        state = load_worker(path, self.rank, plan=self.job.plan, method=self.job.schedule.method)
        for s, st in self.stages.items():
            saved = state["stages"].get(s)
            if saved is None:
                raise ValueError(f"the checkpoint at {path} has no stage {s} for worker {self.rank}")
            st.module.load_state_dict(saved["module"])    # in place: stashed aliases see the weights
            if st.optimizer is not None and saved["optimizer"] is not None:
                st.optimizer.load_state_dict(saved["optimizer"])
            st.policy.load_state_dict(saved["policy"])
        self.rng_state = state["rng"]

    def _checkpoint_points(self) -> dict[int, int]:
        """Action index -> run step (minibatches done) of every checkpoint this worker takes.

        Flushed methods: the last ``U`` of minibatch ``k`` on this worker, step ``start + k + 1``.
        Drained asynchronous schedules: this worker's last action (an update) of every segment,
        step ``start +`` the segment's end. Only steps that are multiples of ``checkpoint_every``.
        """
        cached: dict[int, int] | None = getattr(self, "_ckpt_points", None)
        if cached is not None:
            return cached
        every = int(self.job.options.get("checkpoint_every") or 0)
        sched = self.job.schedule
        start = int(self.job.options.get("resume_step", 0))
        ends: list[int] = []
        if every and sched.options.get("segments"):
            from pipelab.schedules.segments import boundaries

            ends = boundaries(sched)
        last: dict[int, int] = {}    # step -> index of this worker's last action before it
        M = sched.microbatches
        for i, a in enumerate(self.actions):
            k = a.microbatch if a.kind == "U" else a.microbatch // M
            if ends:
                step = next(e for e in ends if k < e)     # the end of k's segment
            else:
                step = k + 1 if a.kind == "U" else -1
            if every and step > 0 and (start + step) % every == 0:
                last[start + step] = i
        points = {i: step for step, i in last.items()}
        self._ckpt_points = points
        return points

    def maybe_checkpoint(self, i: int) -> None:
        """After update ``i``: save if it is this worker's last action before a checkpoint step.

        HetPipe: the save waits for the wave's pull (immediate in a worker process; in the
        reference executor the pull completes once every virtual worker has pushed), so that the
        saved weights are the parameter server's global weights at the cut.
        """
        if not self.job.options.get("checkpoint_every"):
            return
        step = self._checkpoint_points().get(i)
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
        """Write this worker's file of checkpoint ``step``; the last worker to write seals it.

        The manifest records ``drain_every`` so that a resumed asynchronous run keeps the same
        drained segments (and so the same trajectory).
        """
        from pipelab.runtime import checkpoint as ckpt

        root = self.job.options["checkpoint_dir"]
        plan, method = self.job.plan, self.job.schedule.method
        state = self.checkpoint_state()
        state["rng"] = rng
        state["step"] = state["data_position"] = step     # minibatches consumed; data() resumes there
        ckpt.save_worker(root, step, self.rank, state, plan=plan, method=method)
        # the last worker to write its file seals the checkpoint (two doing it write the same manifest)
        d = ckpt.step_dir(root, step)
        if all((d / f"rank-{r}.pt").exists() for r in range(self.job.world_size)):
            every = int(self.job.options["checkpoint_every"])
            extra = {"drain_every": every} if self.job.schedule.options.get("segments") else {}
            ckpt.write_manifest(root, step, plan=plan, method=method, num_workers=self.job.world_size,
                                extra=extra, keep=self.job.options.get("checkpoint_keep", 2))

    def attach_wsp(self, make_endpoint: Callable[[int, int], Any]) -> None:
        """HetPipe: connect each hosted stage's policy to the parameter server (``make_endpoint(stage, vw)``)."""
        for s, st in self.stages.items():
            if hasattr(st.policy, "attach"):
                vw = self.job.schedule.stage_ranks[s].index(self.rank)
                st.policy.attach(make_endpoint(s, vw))

    # ------------------------------------------------------------------ precomputed facts
    def _input_versions(self, stage: int) -> list[int]:
        """Per microbatch this worker forwards on ``stage`` (in order), the input stage's version.

        The input stage's version for microbatch m is the number of input-stage updates that
        precede ``0Fm`` in the action list of the worker that runs it (vertical sync keeps them).
        """
        sched = self.job.schedule
        if stage == 0:
            return []
        v_of: dict[int, int] = {}
        for w in sched.stage_ranks[0]:
            n_updates = 0
            for a in sched.actions[w]:
                if a.stage == 0 and a.kind == "U":
                    n_updates += 1
                elif a.stage == 0 and a.kind == "F":
                    v_of[a.microbatch] = n_updates
        return [v_of.get(a.microbatch, 0) for a in self.actions if a.stage == stage and a.kind == "F"]

    def _update_facts(self) -> tuple[dict[int, int], dict[int, float]]:
        """For each U: its index among this stage's U's, and the divisor of the summed gradient."""
        sched = self.job.schedule
        counts: dict[tuple[int, int], list[int]] = {}   # (worker, stage) -> contributions per U
        for s in self.stages:
            for w in (sched.stage_ranks[s] if self.job.syncs(s) else (self.rank,)):
                has_w = any(a.kind == "W" and a.stage == s for a in sched.actions[w])
                grad_kind = "W" if has_w else "B"
                n, per_u = 0, []
                for a in sched.actions[w]:
                    if a.stage != s:
                        continue
                    if a.kind == grad_kind:
                        n += 1
                    elif a.kind == "U":
                        per_u.append(n)
                        n = 0
                counts[(w, s)] = per_u
        pair: dict[int, int] = {}
        divisor: dict[int, float] = {}
        seen: dict[int, int] = {}
        for i, a in enumerate(self.actions):
            if a.kind != "U":
                continue
            k = seen.get(a.stage, 0)
            seen[a.stage] = k + 1
            pair[i] = k
            total = 0
            for w in (sched.stage_ranks[a.stage] if self.job.syncs(a.stage) else (self.rank,)):
                per_u = counts[(w, a.stage)]
                if k >= len(per_u):
                    raise ValueError(f"worker {self.rank}'s update {a} is its stage's update #{k} but replica worker "
                                     f"{w} has only {len(per_u)} updates; replicas must update in lockstep")
                total += per_u[k]
            divisor[i] = max(total / self.job.microbatches, 1e-12) if total else 1.0
        return pair, divisor

    def _wire(self, members: list[TensorSpec]) -> list[TensorSpec]:
        """The tensors that travel for a message of ``members`` (compressed payloads, if any)."""
        if self.codec is None:
            return list(members)
        from pipelab.runtime.compress import message_specs

        return [TensorSpec(tuple(int(d) for d in shape), str(dt).removeprefix("torch."))
                for shape, dt in message_specs([(sp.shape, sp.torch_dtype) for sp in members], self.codec)]

    def _decode(self, tensors: list[torch.Tensor], members: list[TensorSpec]) -> list[torch.Tensor]:
        if self.codec is None:
            return tensors
        from pipelab.runtime.compress import decode_message

        return decode_message(tensors, [(sp.shape, sp.torch_dtype) for sp in members], self.codec)

    def _encode(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.codec is None:
            return tensors
        from pipelab.runtime.compress import encode_message

        return encode_message(tensors, self.codec)

    def _needs(self, a: Action) -> list[Recv]:
        sched, specs = self.job.schedule, self.job.specs
        s, m = a.stage, a.microbatch
        if a.kind == "F" and s > 0:
            extra = [VERSION_SPEC] if self.stages[s].policy.sends_version else []
            members = list(specs[s - 1])
            return [Recv(sched.worker_of(s - 1, m), tag(ACT, s - 1, m, self.nb), self._wire(members) + extra,
                         members)]
        if a.kind == "B" and s < sched.num_stages - 1:
            g = grad_specs(specs[s])
            if g:
                return [Recv(sched.worker_of(s + 1, m), tag(GRAD, s, m, self.nb), self._wire(g), g)]
        return []

    def recvs(self, i: int) -> list[Recv]:
        """Messages action ``i`` needs before it can run."""
        return self._recvs[i]

    def retire_after(self, i: int) -> list[tuple[int, int]]:
        """Sends ``(dst, tag)`` of this worker that are certainly received once action ``i``'s
        messages have arrived (:meth:`DistComm.retire` may then wait on them without blocking)."""
        return self._retire[i]

    def _retire_plan(self) -> list[list[tuple[int, int]]]:
        """Per action, the sends it proves delivered, by causality over the schedule.

        Our send to peer ``r`` is consumed by ``r``'s action ``j``; when we receive a message that
        ``r`` produced at its action ``k >= j``, ``r`` had already received ours. So after each
        receive from ``r`` we may wait on every earlier send to ``r`` whose consumer precedes the
        receive's producer. (Sends are otherwise held until the end of the run.)
        """
        sched, P, me = self.job.schedule, self.job.schedule.num_stages, self.rank
        index: dict[int, dict[Action, int]] = {}

        def position(w: int, a: Action) -> int:
            if w not in index:
                index[w] = {b: j for j, b in enumerate(sched.actions[w])}
            return index[w].get(a, -1)

        sends: dict[int, list[tuple[int, tuple[int, int]]]] = {}   # peer -> [(consumer index, key)]
        for a in self.actions:
            s, m = a.stage, a.microbatch
            if a.kind == "F" and s < P - 1:
                dst, key, consumer = sched.worker_of(s + 1, m), tag(ACT, s, m, self.nb), Action(s + 1, "F", m)
            elif a.kind == "B" and s > 0:
                dst, key, consumer = sched.worker_of(s - 1, m), tag(GRAD, s - 1, m, self.nb), Action(s - 1, "B", m)
            else:
                continue
            if dst != me:
                sends.setdefault(dst, []).append((position(dst, consumer), (dst, key)))
        for lst in sends.values():
            lst.sort()
        done = {peer: 0 for peer in sends}
        out: list[list[tuple[int, int]]] = []
        for i, a in enumerate(self.actions):
            keys: list[tuple[int, int]] = []
            for r in self._recvs[i]:
                if r.src not in sends:
                    continue
                producer = Action(a.stage - 1, "F", a.microbatch) if a.kind == "F" else Action(a.stage + 1, "B",
                                                                                              a.microbatch)
                k = position(r.src, producer)
                lst, n = sends[r.src], done[r.src]
                while n < len(lst) and 0 <= lst[n][0] <= k:
                    keys.append(lst[n][1])
                    n += 1
                done[r.src] = n
            out.append(keys)
        return out

    # ------------------------------------------------------------------ F / B / W
    def run(self, i: int, received: list[list[torch.Tensor]]) -> tuple[list[Send], int]:
        """Execute ``F``/``B``/``W`` action ``i``; returns (messages to send, weight version read)."""
        a = self.actions[i]
        self.current = a
        st = self.stages.get(a.stage)
        if st is None:
            raise RuntimeError(f"action {a} names stage {a.stage}, which worker {self.rank} does not host "
                               f"(it hosts {sorted(self.stages)})")
        if a.kind == "F":
            return self._forward(st, a.microbatch, received)
        if a.kind == "B":
            return self._backward(st, a.microbatch, received)
        if a.kind == "W":
            return self._weight_grad(st, a.microbatch)
        raise RuntimeError(f"run() got {a}; U goes through begin_update/finish_update")

    def _compute(self, st: StageState, m: int, inputs: list[torch.Tensor], version: int,
                 grad: bool) -> tuple[Any, ...]:
        w = st.policy.weights(version)
        def fn(*xs: Any) -> Any:
            return st.module(*xs) if w is None else torch.func.functional_call(st.module, w, xs)

        with torch.set_grad_enabled(grad):
            if self.recompute:    # keep only the stage's inputs; recompute activations in backward
                from pipelab.runtime.options import run_maybe_checkpointed

                out = run_maybe_checkpointed(fn, tuple(inputs), True)
            else:
                out = fn(*inputs)
            if st.is_last:
                assert self.feed is not None
                loss = self.job.loss_fn(out, self.feed.targets(m)) / self.job.microbatches
                return (loss,)
            return as_tuple(out)

    def _forward(self, st: StageState, m: int, received: list[list[torch.Tensor]]) -> tuple[list[Send], int]:
        upstream: int | None = None
        if st.is_first:
            assert self.feed is not None
            inputs = list(self.feed.inputs(m))
        else:
            tensors = list(received[0])
            if st.policy.sends_version:
                upstream = int(tensors.pop().item())
            tensors = self._decode(tensors, list(self.job.specs[st.index - 1]))
            inputs = [t.detach().requires_grad_(t.is_floating_point()) for t in tensors]
        v = st.policy.forward_version(m, upstream)
        outputs = self._compute(st, m, inputs, v, st.policy.forward_builds_graph)
        st.pending[m] = Pending(inputs, outputs, v)
        st.policy.forward_done(m, v)
        if st.is_last:
            k = m // self.job.microbatches
            st.losses[k] = st.losses.get(k, 0) + outputs[0].detach()  # type: ignore[assignment]
            return [], v
        out = self._encode([o.detach() for o in outputs])
        if st.policy.sends_version:
            out.append(torch.tensor([v], dtype=torch.int64, device=self.device))
        s = st.index
        return [Send(self.job.schedule.worker_of(s + 1, m), tag(ACT, s, m, self.nb), out)], v

    def _weights_used(self, st: StageState, version: int) -> tuple[list[str], list[torch.Tensor]]:
        w = st.policy.weights(version)
        src: dict[str, torch.Tensor] = w if w is not None else dict(st.params)
        names = [n for n, t in src.items() if t.requires_grad]
        return names, [src[n] for n in names]

    def _backward(self, st: StageState, m: int, received: list[list[torch.Tensor]]) -> tuple[list[Send], int]:
        pend = st.pending[m]
        v = st.policy.backward_version(m)
        if not st.policy.forward_builds_graph:   # naive-async: recompute with the weights B reads
            pend.outputs = self._compute(st, m, pend.inputs, v, True)
        outs: list[torch.Tensor] = []
        gouts: list[Any] = []
        if st.is_last:
            outs, gouts = [pend.outputs[0]], [None]
        else:
            grads = iter(self._decode(list(received[0]), grad_specs(self.job.specs[st.index]))) if received \
                else iter(())
            for o, spec in zip(pend.outputs, self.job.specs[st.index]):
                if spec.is_float:
                    g = next(grads)
                    if isinstance(o, torch.Tensor) and o.requires_grad:
                        outs.append(o)
                        gouts.append(g)
        leaves = [x for x in pend.inputs if x.requires_grad]
        split = self.split[st.index]
        names, weights = self._weights_used(st, v)
        targets = leaves + ([] if split else weights)
        if outs and targets:
            # backward() accumulates into .grad in place (no fresh gradient tensors per microbatch):
            # about twice as fast as autograd.grad plus a sum on CPU
            torch.autograd.backward(outs, gouts, inputs=targets, retain_graph=split)
        sends: list[Send] = []
        if not st.is_first:
            msg = [(torch.zeros_like(x) if x.grad is None else x.grad) for x in pend.inputs if x.is_floating_point()]
            if msg:
                s = st.index
                sends.append(Send(self.job.schedule.worker_of(s - 1, m), tag(GRAD, s - 1, m, self.nb),
                                  self._encode(msg)))
        if split:
            pend.grad_outputs, pend.grad_targets = gouts, outs
        else:
            self._to_master(st, names, weights)
            del st.pending[m]
            st.policy.backward_done(m)
        return sends, v

    def _weight_grad(self, st: StageState, m: int) -> tuple[list[Send], int]:
        pend = st.pending.pop(m)
        v = st.policy.backward_version(m)
        names, weights = self._weights_used(st, v)
        outs = pend.grad_targets or []
        if outs and weights:
            torch.autograd.backward(outs, pend.grad_outputs, inputs=weights)
            self._to_master(st, names, weights)
        st.policy.backward_done(m)
        return [], v

    @staticmethod
    def _to_master(st: StageState, names: list[str], weights: list[torch.Tensor]) -> None:
        """Move gradients computed against a stashed version onto the master weights."""
        for n, t in zip(names, weights):
            p = st.params[n]
            if t is p or t.grad is None:
                continue
            if p.grad is None:
                p.grad = t.grad
            else:
                p.grad.add_(t.grad)
            t.grad = None

    # ------------------------------------------------------------------ U
    def begin_update(self, i: int) -> torch.Tensor | None:
        """Start update action ``i``: the flattened gradients to sum over replicas (None if unreplicated)."""
        a = self.actions[i]
        self.current = a
        st = self.stages[a.stage]
        if a.stage in self.coalescers:    # the minibatch's deferred weight gradients, before any all-reduce
            self.coalescers[a.stage].flush()
        params = [p for p in st.params.values() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if not st.syncs or not params:
            return None
        return torch._utils._flatten_dense_tensors([p.grad for p in params])

    def finish_update(self, i: int, reduced: torch.Tensor | None) -> int:
        """Finish update ``i`` with the summed gradients; returns the version it produced."""
        a = self.actions[i]
        st = self.stages[a.stage]
        params = [p for p in st.params.values() if p.requires_grad]
        if reduced is not None:
            for p, g in zip(params, torch._utils._unflatten_dense_tensors(reduced, [p.grad for p in params])):
                p.grad.copy_(g)  # type: ignore[union-attr]
        div = self.u_divisor[i]
        if div != 1.0:
            for p in params:
                p.grad.div_(div)  # type: ignore[union-attr]
        if st.optimizer is not None:
            st.policy.before_step(st.optimizer)
        st.policy.about_to_update()
        if st.optimizer is not None:
            st.optimizer.step()
            st.optimizer.zero_grad(set_to_none=True)
        st.policy.updated()
        self.maybe_checkpoint(i)
        return st.policy.latest

    def slow_down(self, elapsed_s: float) -> None:
        """Emulate a slower device (option ``slowdown={rank: factor}``): sleep (factor - 1) x elapsed."""
        sd = self.job.options.get("slowdown")
        if sd:
            from pipelab.runtime.options import slow_down

            slow_down(self.rank, sd, elapsed_s)

    # ------------------------------------------------------------------ results
    def result(self) -> dict[str, Any]:
        """What the parent needs at the end: weights (replica 0 only), loss parts, versions held."""
        sched = self.job.schedule
        state: dict[str, torch.Tensor] = {}
        for s, st in self.stages.items():
            if sched.stage_ranks[s][0] == self.rank:
                state.update({k: v.detach().cpu().clone() for k, v in st.module.graph_module.state_dict().items()})
        losses: dict[int, float] = {}
        for st in self.stages.values():
            for k, v in st.losses.items():
                losses[k] = losses.get(k, 0.0) + float(v)
        return {"rank": self.rank, "state": state, "losses": losses,
                "versions_held": {s: st.policy.max_held for s, st in self.stages.items()},
                "weight_bytes": {s: int(getattr(st.policy, "max_weight_bytes", 0)) for s, st in self.stages.items()}}


class Clock:
    """Seconds since the job's common start (rank 0's wall clock after the start barrier)."""

    def __init__(self, t0_wall: float) -> None:
        self.offset = time.time() - t0_wall
        self.base = time.perf_counter()

    def now(self) -> float:
        """Seconds since the common start."""
        return time.perf_counter() - self.base + self.offset


class QueueSink:
    """Streams event tuples to the parent in batches (a put per ~32 events or 0.1 s)."""

    def __init__(self, queue: Any, rank: int, batch: int = 32, every_s: float = 0.1) -> None:
        self.queue, self.rank, self.batch, self.every_s = queue, rank, batch, every_s
        self.buf: list[EventTuple] = []
        self.last = time.perf_counter()
        self.reported = False

    def emit(self, ev: EventTuple) -> None:
        """Queue one event; send the batch when it is big or old enough."""
        self.buf.append(ev)
        if len(self.buf) >= self.batch or time.perf_counter() - self.last > self.every_s:
            self.flush()

    def flush(self) -> None:
        """Send what is buffered."""
        if self.buf:
            self.queue.put(("events", self.rank, self.buf))
            self.buf = []
        self.last = time.perf_counter()

    def done(self, result: dict[str, Any]) -> None:
        """Send the final result (as bytes: tensors in a queue would go through shared memory that
        vanishes when this process exits before the parent reads them)."""
        import io

        self.flush()
        buf = io.BytesIO()
        torch.save(result, buf)
        self.queue.put(("done", self.rank, buf.getvalue()))

    def error(self, stage: int, action: str, tb: str) -> None:
        """Report a failure (once)."""
        if self.reported:
            return
        self.reported = True
        self.flush()
        self.queue.put(("error", self.rank, (stage, action, tb)))


def execute(worker: Worker, comm: DistComm, clock: Clock, emit: Callable[[EventTuple], None]) -> None:
    """Run every action of ``worker`` in order over ``comm``, emitting one event per action."""
    n = len(worker.actions)
    for i, a in enumerate(worker.actions):
        for j in range(i, min(i + LOOKAHEAD, n)):
            for r in worker.recvs(j):
                comm.post(r)
        worker.current = a
        received = []
        for r in worker.recvs(i):
            t = clock.now()
            received.append(comm.wait(r))
            t2 = clock.now()
            if t2 - t > 1e-4:
                emit((worker.rank, a.stage, "recv", a.microbatch, t, t2,
                      sum(s.nbytes for s in r.specs), -1, -1, r.src))
        comm.retire(worker.retire_after(i))
        start = clock.now()
        nbytes = 0
        if a.kind == "U":
            flat = worker.begin_update(i)
            if flat is not None:
                comm.allreduce(a.stage, flat)
                nbytes = flat.numel() * flat.element_size()
            version = worker.finish_update(i, flat)
        else:
            sends, version = worker.run(i, received)
            for s in sends:
                nbytes += comm.send(s)
        if worker.device.type == "cuda":
            torch.cuda.synchronize(worker.device)
        worker.slow_down(clock.now() - start)
        emit((worker.rank, a.stage, a.kind, a.microbatch, start, clock.now(), nbytes, version, i, -1))
    comm.flush()


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (no orphaned workers)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
        except OSError:
            pass


def run_distributed(job: Job, rank: int, sink: Any, *, init_method: str | None = None,
                    local_rank: int | None = None, gather: bool = False, wsp_conn: Any = None) -> dict[str, Any]:
    """Join the process group, execute this rank's actions, return its result (see :meth:`Worker.result`)."""
    import torch.distributed as dist

    from pipelab.runtime.options import tune_malloc

    torch.set_num_threads(1)
    tune_malloc()    # no page faults for the buffers every step reallocates (see its docstring)
    world = job.world_size
    if job.backend == "nccl":
        device = torch.device("cuda", rank if local_rank is None else local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    init = init_method or f"tcp://{job.master_addr}:{job.master_port}"
    dist.init_process_group(job.backend, init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=job.timeout))
    try:
        groups = {s: dist.new_group(list(rs)) for s, rs in enumerate(job.schedule.stage_ranks) if job.syncs(s)}
        worker = Worker(job, rank, device)
        clients: list[Any] = []
        if wsp_conn is not None:    # HetPipe: this worker's end of the parameter server
            from pipelab.runtime.wsp import WSPClient

            def endpoint(stage: int, vw: int) -> Any:
                clients.append(WSPClient(wsp_conn, stage, vw, timeout=job.timeout))
                return clients[-1]
            worker.attach_wsp(endpoint)
        comm = DistComm(rank, device, groups)
        torch.set_rng_state(worker.rng_state)
        if device.type == "cuda":
            torch.cuda.manual_seed(job.seed * 1_000_003 + rank + 1)
        dist.barrier()
        t0 = torch.tensor([time.time()], dtype=torch.float64, device=device if job.backend == "nccl" else "cpu")
        dist.broadcast(t0, src=0)
        clock = Clock(float(t0.item()))
        try:
            execute(worker, comm, clock, sink.emit)
        except BaseException:
            a = worker.current
            sink.error(a.stage if a else -1, str(a) if a else "start-up", traceback.format_exc())
            raise
        for c in clients[:1]:    # one pipe per worker
            c.stop()
        dist.barrier()
        result = worker.result()
        if gather:   # torchrun: rank 0 collects every rank's result and events
            everything: list[Any] = [None] * world if rank == 0 else []
            dist.gather_object((result, getattr(sink, "events", [])), everything if rank == 0 else None, dst=0)
            result["all"] = everything
        return result
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def process_main(job: Job, rank: int, queue: Any, wsp_conn: Any = None) -> None:
    """Entry point of a spawned worker process (torch.multiprocessing)."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent decides; it cancels the whole job
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    sink = QueueSink(queue, rank)
    try:
        result = run_distributed(job, rank, sink, wsp_conn=wsp_conn)
    except BaseException:
        sink.error(-1, "start-up", traceback.format_exc())
        sink.flush()
        time.sleep(0.2)   # let the queue's feeder thread deliver the error
        os._exit(1)
    sink.done(result)
    time.sleep(0.05)
