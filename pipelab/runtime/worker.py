"""One worker: builds its stage(s) and executes its action list, in order, exactly as scheduled.

:class:`Worker` is transport-free: :meth:`Worker.recvs` names the messages action ``i`` needs,
:meth:`Worker.run` executes an ``F``/``B``/``W`` on them and returns the messages to send, and a ``U``
is :meth:`Worker.begin_update` (gradients to all-reduce) then :meth:`Worker.finish_update`. The
process driver (:mod:`pipelab.runtime.process`) and the reference executor
(:mod:`pipelab.runtime.local`) move the messages; the semantics both share are in docs/runtime.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from pipelab.graph import as_tuple, trace
from pipelab.runtime import coalesce
from pipelab.runtime.comm import ACT, GRAD, VERSION_SPEC, Recv, Send, TensorSpec, grad_specs, tag
from pipelab.runtime.compress import decode_message, encode_message, message_specs
from pipelab.runtime.guards import check_grads, check_loss, warn
from pipelab.runtime.job import Job
from pipelab.runtime.memory import MemoryMeter
from pipelab.runtime.options import run_maybe_checkpointed
from pipelab.runtime.policies import policy_for
from pipelab.runtime.stage import Feed, Pending, StageState
from pipelab.runtime.ties import TieReducer
from pipelab.runtime.worker_checkpoint import Checkpointing
from pipelab.schedules.actions import Action
from pipelab.schedules.worker_view import stage_reads, update_pairs


@dataclass
class WorkerResult:
    """What a worker hands back at the end of a run (pickled to the parent, or gathered by torchrun)."""

    rank: int
    state: dict[str, torch.Tensor]              # its stages' weights (replica 0 of each stage only)
    losses: dict[int, float]                    # minibatch -> its part of the loss (last stage)
    versions_held: dict[int, int]               # stage -> most weight versions held at once
    weight_bytes: dict[int, int]                # stage -> most bytes of weight versions held
    # measure_memory=True: RunResult's fields of these names (the peak is the CUDA allocator's on a GPU)
    peak_memory: int = 0
    peak_held: int = 0
    peak_state: int = 0
    memory_breakdown: dict[str, int] = field(default_factory=dict)
    memory_timeline: list[tuple[int, int]] = field(default_factory=list)
    wsp_log: list[Any] = field(default_factory=list)   # HetPipe, reference executor: the server's log
    transport: str = "in process"    # how its messages travelled: "shared memory", "gloo", "nccl"
    process_rank: int = -1           # its process (differs from ``rank`` for a tensor group's members)
    shard_dims: dict[str, int] = field(default_factory=dict)   # split weights' cut dimensions


class Worker(Checkpointing):
    """Executes worker ``rank``'s action list of ``job.schedule`` (transport-free; see module doc)."""

    def __init__(self, job: Job, rank: int, device: torch.device | str = "cpu", *,
                 tensor: Any = None, process_rank: int | None = None) -> None:
        self.job, self.rank = job, rank
        #: this process's rank (a tensor group's members share ``rank``, the schedule worker)
        self.process_rank = rank if process_rank is None else process_rank
        self.tensor = tensor       # a tensor_parallel.Group, or None
        self.device = torch.device(device)
        sched = job.schedule
        self.actions: tuple[Action, ...] = sched.actions[rank]
        self.nb = max(sched.num_stages - 1, 1)
        with torch.random.fork_rng(devices=[]):   # the same initial weights as the plain model
            torch.manual_seed(job.seed)
            model = job.model_fn()
        gm = trace(model, **job.trace_kwargs)
        split = None
        if tensor is not None and tensor.degree > 1:
            from pipelab.runtime.tensor_parallel import plan_of

            split = (tensor, plan_of(model))
        factory = policy_for(sched.method, job.policy_options)
        self.stages: dict[int, StageState] = {}
        for s in sched.stages_of(rank):
            self.stages[s] = StageState(job, gm, s, self.device, factory, stage_reads(sched, rank, s), split)
        del model, gm
        self.split = {s: any(a.kind == "W" and a.stage == s for a in self.actions) for s in self.stages}
        ends = 0 in self.stages or sched.num_stages - 1 in self.stages
        self.feed = Feed(job, self.device) if ends else None
        # this worker's own random stream (dropout, ...): the same in a process and in the
        # reference executor, which swaps it in around each of this worker's actions
        self.rng_state = torch.Generator().manual_seed(job.seed * 1_000_003 + rank + 1).get_state()
        self.codec = job.runtime.compression
        self.recompute = job.runtime.recompute
        # coalesce_wgrad: Linears defer their weight gradients to one GEMM at U (pipelab.runtime.coalesce)
        self.coalescers: dict[int, Any] = {}
        if job.runtime.coalesce_wgrad:
            coalesce.check_method(sched.method, any(a.kind == "W" for a in self.actions))
            self.coalescers = {s: coalesce.install(st.module) for s, st in self.stages.items()}
        self._recvs = [self._needs(a) for a in self.actions]
        self._retire = self._retire_plan()
        self.u_pair, self.u_divisor = update_pairs(sched, rank, self.stages, job.syncs, job.microbatches)
        # shared parameters: summed over their holders before this worker's first U of each minibatch
        self.ties = TieReducer(job.ties, sched, rank, {
            s: dict(st.module.named_parameters(remove_duplicate=False)) for s, st in self.stages.items()})
        self.current: Action | None = None
        self.warn: Callable[[str], None] = warn    # a driver may send warnings to its parent instead
        # measure_memory: the executor samples after every action (Worker.measure) and names the
        # message buffers it holds for this worker (meter.messages)
        self.meter = MemoryMeter(self.stages) if job.runtime.measure_memory else None
        # checkpoints: the last U of each minibatch on this worker is where one may be taken
        self.start_step = job.runtime.resume_step
        self._last_u: dict[int, int] = {a.microbatch: i for i, a in enumerate(self.actions) if a.kind == "U"}
        if job.runtime.resume:
            self.restore(job.runtime.resume)

    def attach_wsp(self, make_endpoint: Callable[[int, int], Any]) -> None:
        """HetPipe: connect each hosted stage's policy to the parameter server."""
        for s, st in self.stages.items():
            if hasattr(st.policy, "attach"):
                vw = self.job.schedule.stage_ranks[s].index(self.rank)
                st.policy.attach(make_endpoint(s, vw))

    def _wire(self, members: list[TensorSpec]) -> list[TensorSpec]:
        """The tensors that travel for a message of ``members`` (compressed payloads, if any)."""
        if self.codec is None:
            return list(members)
        wire = message_specs([(sp.shape, sp.torch_dtype) for sp in members], self.codec)
        return [TensorSpec.of(shape, dtype) for shape, dtype in wire]

    def _decode(self, tensors: list[torch.Tensor], members: list[TensorSpec]) -> list[torch.Tensor]:
        if self.codec is None:
            return tensors
        return decode_message(tensors, [(sp.shape, sp.torch_dtype) for sp in members], self.codec)

    def _encode(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.codec is None:
            return tensors
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
        """Sends ``(dst, tag)`` certainly received once action ``i``'s messages have arrived."""
        return self._retire[i]

    def _retire_plan(self) -> list[list[tuple[int, int]]]:
        """Per action, the sends it proves delivered: a send to ``r`` consumed by ``r``'s action ``j`` is
        delivered once we receive what ``r`` produced at an action ``k >= j`` (causality)."""
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
                dst, key = sched.worker_of(s - 1, m), tag(GRAD, s - 1, m, self.nb)
                consumer = Action(s - 1, "B", m)
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
                producer = (Action(a.stage - 1, "F", a.microbatch) if a.kind == "F"
                            else Action(a.stage + 1, "B", a.microbatch))
                k = position(r.src, producer)
                lst, n = sends[r.src], done[r.src]
                while n < len(lst) and 0 <= lst[n][0] <= k:
                    keys.append(lst[n][1])
                    n += 1
                done[r.src] = n
            out.append(keys)
        return out

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
            return st.module(*xs) if w is None else st.reparam(w, *xs)

        with torch.set_grad_enabled(grad), (self.meter.saving() if self.meter else nullcontext()):
            # recompute: keep only the stage's inputs; recompute activations in backward
            out = run_maybe_checkpointed(fn, tuple(inputs), self.recompute,
                                         buffers=tuple(st.module.buffers()))
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
            check_loss(outputs[0], step=k + self.start_step, stage=st.index, action=str(self.current),
                       mode=self.job.runtime.on_nonfinite, warn=self.warn)
            st.losses[k] = st.losses.get(k, 0) + outputs[0].detach()
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
            msg = [torch.zeros_like(x) if x.grad is None else x.grad
                   for x in pend.inputs if x.is_floating_point()]
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

    def tie_contributions(self, i: int) -> list[tuple[Any, torch.Tensor]]:
        """Before update action ``i``: each tie group due there and this worker's gradient for it (the sum
        of its copies'), to be summed over the group and handed to :meth:`tie_results`."""
        due = self.ties.due.get(i, [])
        if due:
            self.current = self.actions[i]
            for s in self.coalescers:     # deferred weight gradients first
                self.coalescers[s].flush()
        return [(g, self.ties.contribution(g)) for g in due]

    def tie_results(self, sums: list[tuple[Any, torch.Tensor]]) -> None:
        """Give each tie's copies on this worker the group's summed gradient."""
        for g, total in sums:
            self.ties.apply(g, total)

    def _replicated(self, stage: int, st: StageState) -> list[torch.nn.Parameter]:
        """The parameters the replicas of ``stage`` all-reduce: trainable ones a tie does not cover."""
        return [p for p in st.params.values() if p.requires_grad and not self.ties.is_tied(stage, p)]

    def begin_update(self, i: int) -> torch.Tensor | None:
        """Start update action ``i``: the flattened gradients to sum over replicas (None if unreplicated)."""
        a = self.actions[i]
        self.current = a
        st = self.stages[a.stage]
        if a.stage in self.coalescers:    # the minibatch's deferred weight gradients, before any all-reduce
            self.coalescers[a.stage].flush()
        for p in st.params.values():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        params = self._replicated(a.stage, st)
        if not st.syncs or not params:
            return None
        return torch._utils._flatten_dense_tensors([p.grad for p in params])

    def finish_update(self, i: int, reduced: torch.Tensor | None) -> int:
        """Finish update ``i`` with the summed gradients; returns the version it produced."""
        a = self.actions[i]
        st = self.stages[a.stage]
        if reduced is not None:
            synced = self._replicated(a.stage, st)
            for p, g in zip(synced, torch._utils._unflatten_dense_tensors(reduced, [p.grad for p in synced])):
                p.grad.copy_(g)  # type: ignore[union-attr]
        params = [p for p in st.params.values() if p.requires_grad]
        div = self.u_divisor[i]
        if div != 1.0:
            for p in params:
                p.grad.div_(div)  # type: ignore[union-attr]
        steps = check_grads([p.grad for p in params if p.grad is not None],
                            step=a.microbatch + self.start_step, stage=a.stage, action=str(a),
                            mode=self.job.runtime.on_nonfinite, warn=self.warn)
        if st.optimizer is not None:
            st.policy.before_step(st.optimizer)
        st.policy.about_to_update()
        if st.optimizer is not None:
            if steps:    # on_nonfinite="skip" drops an update whose gradients are not finite
                st.optimizer.step()
            st.optimizer.zero_grad(set_to_none=True)
        st.policy.updated()
        self.maybe_checkpoint(i)
        return st.policy.latest

    def slow_down(self, elapsed_s: float) -> None:
        """Emulate a slower device (option ``slowdown={rank: factor}``): sleep (factor - 1) x elapsed."""
        f = float(self.job.runtime.slowdown.get(self.rank, 1.0))
        if f > 1.0 and elapsed_s > 0:
            time.sleep((f - 1.0) * elapsed_s)

    def measure(self, i: int) -> None:
        """Sample the memory meter after action ``i`` (option ``measure_memory``; else nothing)."""
        if self.meter is not None:
            self.meter.sample(i)

    def result(self) -> WorkerResult:
        """What the parent needs at the end: weights (replica 0 only), loss parts, versions held."""
        owned = [st for s, st in self.stages.items() if self.job.schedule.stage_ranks[s][0] == self.rank]
        state = {k: v.detach().cpu().clone() for st in owned
                 for k, v in st.module.graph_module.state_dict().items()}
        losses: dict[int, float] = {}
        leader = self.tensor is None or self.tensor.index == 0    # a group's members share one loss
        for st in self.stages.values() if leader else ():
            for k, v in st.losses.items():
                losses[k] = losses.get(k, 0.0) + float(v)
        m = self.meter
        return WorkerResult(self.rank, state, losses,
                            versions_held={s: st.policy.max_held for s, st in self.stages.items()},
                            weight_bytes={s: int(getattr(st.policy, "max_weight_bytes", 0))
                                          for s, st in self.stages.items()},
                            peak_memory=m.peak if m else 0, peak_held=m.peak_held if m else 0,
                            peak_state=m.peak_state if m else 0,
                            memory_breakdown=dict(m.breakdown) if m else {},
                            memory_timeline=list(m.timeline) if m else [], process_rank=self.process_rank,
                            shard_dims={k: d for st in owned for k, d in st.shard_dims.items()})

