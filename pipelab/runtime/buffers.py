"""Weight policies of issue 6: 2BW, bounded buffer (K versions), PipeMare, HetPipe; and their math.

The pure rules first, usable without a runtime (and used as oracles in tests):

* :func:`delayed_version` — which version minibatch ``k`` reads when weights are double- or
  K-buffered: ``max(0, k - d)`` with ``d = 1`` for PipeDream-2BW (Narayanan et al., "Memory-Efficient
  Pipeline-Parallel DNN Training", ICML'21, §3: ``W(t+1) = W(t) - nu * grad f(W(t-1))``) and
  ``d = K - 1`` for the bounded buffer of Lv et al. (CCGrid'23), so K = 2 is 2BW and K = NOAM + 1
  keeps as many versions as PipeDream's stash.
* :func:`delayed_sgd` — the whole-model recurrence ``W(t+1) = W(t) - nu * grad f_t(W(t-d))``.

Then the policies (see :mod:`pipelab.runtime.weights` for the interface and the first three):

* :class:`DelayedVersions` (``2bw``, ``buffered``): every microbatch of minibatch ``k`` reads
  version ``max(0, k - d)`` in ``F`` and ``B``; gradients of the ``M`` microbatches coalesce into one
  update per minibatch.
* :class:`PipeMarePolicy` (``pipemare``): no stash; per-stage learning-rate rescheduling and
  discrepancy-corrected backward weights (:mod:`pipelab.runtime.pipemare`).
* :class:`HetPipePolicy` (``hetpipe``): PipeDream stashing inside a virtual worker plus HetPipe's
  WSP push/pull every ``wave`` updates (:mod:`pipelab.runtime.wsp`).

Memory: a stashed version that equals the master weights *aliases* their storage (a separate
tensor object, so autograd's in-place checks stay per-version) and is split off copy-on-write
right before the optimizer's in-place step (:meth:`VersionStore.about_to_update`). So a stage
holding ``n`` versions holds exactly ``n`` weight copies, which :meth:`VersionStore.weight_bytes`
measures by counting distinct storages - the quantity the simulator's memory model predicts as
``weights + stashed_weights``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from pipelab.runtime.pipemare import PipeMareConfig, PipeMareState, steady_state_delays
from pipelab.runtime.weights import WeightPolicy, register
from pipelab.schedules._common import delayed_rule


# ---------------------------------------------------------------------- pure rules
def delayed_version(minibatch: int, delay: int) -> int:
    """Version read by every action of ``minibatch`` under a ``delay``-step rule: ``max(0, k - d)``."""
    if delay < 0:
        raise ValueError(f"delay={delay} must be >= 0")
    return max(0, minibatch - delay)


def delay_for(method: str, versions: int | None = None) -> int:
    """The delay ``d`` of ``2bw`` (1) or ``buffered`` with ``versions=K`` (``K - 1``, K >= 2)."""
    if method == "2bw":
        return 1
    if method == "buffered":
        if versions is None or int(versions) < 2:
            raise ValueError(f"method 'buffered' needs versions=K with K >= 2 (got {versions!r}); "
                             "K = 2 behaves as 2bw")
        return int(versions) - 1
    raise ValueError(f"no delay rule for method {method!r}; use '2bw' or 'buffered'")


def delayed_sgd(w0: torch.Tensor, grad: Callable[[int, torch.Tensor], torch.Tensor], lr: float, steps: int,
                delay: int) -> list[torch.Tensor]:
    """``W(t+1) = W(t) - lr * grad(t, W(max(0, t - delay)))``; returns ``[W(0), ..., W(steps)]``.

    ``delay = 1`` is PipeDream-2BW's rule (ICML'21 §3), ``delay = 0`` plain SGD.
    """
    ws = [w0.clone()]
    for t in range(steps):
        ws.append(ws[t] - lr * grad(t, ws[delayed_version(t, delay)]))
    return ws


# ---------------------------------------------------------------------- version store
def _alias(p: torch.Tensor) -> torch.Tensor:
    """A new leaf tensor sharing ``p``'s storage but not its autograd version counter."""
    t = torch.empty(0, dtype=p.dtype, device=p.device).set_(p.untyped_storage(), p.storage_offset(),
                                                            p.size(), p.stride())
    return t.requires_grad_(p.requires_grad)


class VersionStore(WeightPolicy):
    """Shared machinery: stashed versions keyed by an *epoch* (every change of the master weights),
    copy-on-write aliases of the master, distinct-storage byte accounting.

    ``version`` (what the trace shows) is the number of local updates; ``epoch`` also counts other
    changes of the master (a HetPipe pull), so two contents never share a key.
    """

    name = "store"

    def __init__(self, params: dict[str, nn.Parameter], stage: int, upcoming_input_versions: Iterable[int] = ()) -> None:
        super().__init__(params, stage)
        self.epoch = 0
        self.epoch_version: dict[int, int] = {0: 0}
        self.stash: dict[int, dict[str, torch.Tensor]] = {}
        self.in_flight_epoch: dict[int, int] = {}
        self.max_weight_bytes = self.weight_bytes()

    # -- stash
    def _aliases_master(self, e: int) -> bool:
        st = self.stash.get(e)
        if not st:
            return False
        n, t = next(iter(st.items()))
        return t.untyped_storage().data_ptr() == self.params[n].untyped_storage().data_ptr()

    def _tensors(self, e: int) -> dict[str, torch.Tensor]:
        if e not in self.stash:
            if e != self.epoch:
                raise RuntimeError(f"stage {self.stage}: weights of epoch {e} (version {self.epoch_version.get(e)}) "
                                   f"are no longer held (held: {sorted(self.stash)}, current {self.epoch})")
            self.stash[e] = {n: _alias(p) for n, p in self.params.items()}
        return self.stash[e]

    def about_to_update(self) -> None:
        """Before an in-place change of the master: give it fresh storage if a stash aliases it."""
        self._release()
        if self._aliases_master(self.epoch):
            with torch.no_grad():
                for p in self.params.values():
                    p.data = p.data.clone()
        self._measure()

    def _new_epoch(self, version: int) -> None:
        self.epoch += 1
        self.epoch_version[self.epoch] = version
        self._release()
        self._measure()

    def _needed_epochs(self) -> set[int]:
        return set(self.in_flight_epoch.values())

    def _release(self) -> None:
        keep = self._needed_epochs()
        for e in [e for e in self.stash if e not in keep]:
            del self.stash[e]
        for e in [e for e in self.epoch_version if e not in keep and e != self.epoch]:
            del self.epoch_version[e]

    # -- accounting
    def weight_bytes(self) -> int:
        """Bytes of distinct storages among the master weights and every stashed version."""
        seen: dict[int, int] = {}
        srcs: list[Mapping[str, torch.Tensor]] = [self.params, *self.stash.values()]
        for src in srcs:
            for t in src.values():
                s = t.untyped_storage()
                seen[s.data_ptr()] = s.nbytes()
        return sum(seen.values())

    @property
    def held(self) -> int:
        """Distinct weight versions held (stashed ones plus the master's)."""
        return len(set(self.stash) | {self.epoch})

    def _measure(self) -> None:
        super()._measure()
        self.max_weight_bytes = max(getattr(self, "max_weight_bytes", 0), self.weight_bytes())

    # -- interface
    def weights(self, version: int) -> dict[str, torch.Tensor] | None:
        """Tensors of the epoch the asking action uses (set by forward_version / backward_version)."""
        return self._tensors(self._current)

    def forward_done(self, microbatch: int, version: int) -> None:
        """Remember the epoch ``microbatch``'s forward read."""
        self.in_flight_epoch[microbatch] = self._current
        super().forward_done(microbatch, version)

    def backward_version(self, microbatch: int) -> int:
        """The version the microbatch's forward read (its tensors are kept until backward_done)."""
        self._current = self.in_flight_epoch[microbatch]
        return self.epoch_version[self._current]

    def backward_done(self, microbatch: int) -> None:
        """Release what only ``microbatch`` needed."""
        self.in_flight_epoch.pop(microbatch, None)
        super().backward_done(microbatch)

    def updated(self) -> None:
        """The optimizer stepped: a new version (and epoch)."""
        self.latest += 1
        self._new_epoch(self.latest)

    _current = 0


class DelayedVersions(VersionStore):
    """2BW / bounded buffer: minibatch ``k`` reads version ``max(0, k - d)`` in F and B."""

    name = "delayed"

    def __init__(self, params: dict[str, nn.Parameter], stage: int, upcoming_input_versions: Iterable[int] = (), *,
                 delay: int, microbatches: int, segments: Sequence[int] | None = None) -> None:
        super().__init__(params, stage)
        if microbatches < 1:
            raise ValueError(f"microbatches={microbatches} must be >= 1")
        self.delay = int(delay)
        self.M = int(microbatches)
        # drained segments restart the rule from the version the drain left (schedules.segments)
        self.segments = [int(n) for n in segments] if segments else None
        self.next_minibatch = 0        # lower bound of the minibatch of this stage's next forward

    def _epoch_of_version(self, v: int) -> int:
        for e, ver in self.epoch_version.items():
            if ver == v:
                return e
        raise RuntimeError(f"stage {self.stage}: version {v} is needed but no longer held "
                           f"(held {sorted(self.epoch_version.values())}, newest {self.latest}); the schedule "
                           f"does not follow the {self.delay}-step rule")

    def _rule(self, k: int) -> int:
        return delayed_rule(k, self.delay, self.segments)

    def forward_version(self, microbatch: int, upstream_version: int | None) -> int:
        """``max(0, k - d)`` for minibatch ``k = microbatch // M`` (``max(k0, k - d)`` in a drained
        segment starting at minibatch ``k0``)."""
        k = microbatch // self.M
        v = self._rule(k)
        if v > self.latest:
            raise RuntimeError(f"stage {self.stage}: minibatch {k} needs version {v} but only {self.latest} "
                               "updates happened; the schedule runs its forward too early")
        self._current = self._epoch_of_version(v)
        self.next_minibatch = max(self.next_minibatch, k)
        return v

    def _next_forward_minibatch(self) -> int:
        # a lower bound on the minibatch of this stage's next F: F's come in minibatch order, and the
        # update closing minibatch k follows all of k's backward (so all of k's forwards) on this stage
        return max(self.next_minibatch, self.latest + (1 if self._updating else 0))

    _updating = False

    def _needed_epochs(self) -> set[int]:
        lo = self._rule(self._next_forward_minibatch())
        keep = super()._needed_epochs()
        keep |= {e for e, v in self.epoch_version.items() if v >= lo}
        return keep

    def about_to_update(self) -> None:
        """Drop versions no forward will read again, keep the newest if one will (alias, copy-on-write)."""
        self._updating = True
        try:
            self._release()
            if self.latest >= self._rule(self._next_forward_minibatch()):
                self._tensors(self.epoch)
            super().about_to_update()
        finally:
            self._updating = False


class PipeMarePolicy(WeightPolicy):
    """PipeMare: no stash; F reads the newest weights; B recomputes with corrected weights (T2) and
    the optimizer's step size follows T1 (see :mod:`pipelab.runtime.pipemare`)."""

    name = "pipemare"
    forward_builds_graph = False

    def __init__(self, params: dict[str, nn.Parameter], stage: int, upcoming_input_versions: Iterable[int] = (), *,
                 tau_fwd: int, tau_bwd: int, config: PipeMareConfig) -> None:
        super().__init__(params, stage)
        self.state = PipeMareState([p for p in params.values()], tau_fwd, tau_bwd, config)
        self._in_backward: int | None = None
        self._corrected: dict[str, torch.Tensor] | None = None
        self._base_lrs: list[float] | None = None
        self.steps = 0

    def backward_version(self, microbatch: int) -> int:
        """The newest version; B will read the corrected weights derived from it."""
        self._in_backward = microbatch
        self._corrected = None
        return self.latest

    def weights(self, version: int) -> dict[str, torch.Tensor] | None:
        """Master weights in F; T2's corrected weights (one set per backward) in B."""
        if self._in_backward is None or not self.state.config.discrepancy_correction \
                or self.state.tau_fwd == self.state.tau_bwd:
            return None
        if self._corrected is None:
            names = list(self.params)
            corr = self.state.backward_params([self.params[n] for n in names])
            self._corrected = {n: c.requires_grad_(self.params[n].requires_grad) for n, c in zip(names, corr)}
        return self._corrected

    def backward_done(self, microbatch: int) -> None:
        """Drop the corrected weights of this backward."""
        self._in_backward = None
        self._corrected = None
        super().backward_done(microbatch)

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Set this step's learning rate: base * tau ** -(1 - min(k / K, 1)) (T1)."""
        if self._base_lrs is None:
            self._base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        f = self.state.lr_factor(self.steps)
        for g, base in zip(optimizer.param_groups, self._base_lrs):
            g["lr"] = base * f

    def about_to_update(self) -> None:
        """First half of the delta EMA: delta <- gamma * delta - (1 - gamma) * w_before (no copy kept)."""
        g = self.state.gamma
        with torch.no_grad():
            for d, p in zip(self.state.delta, self.params.values()):
                d.mul_(g).sub_(p.detach(), alpha=1.0 - g)

    def updated(self) -> None:
        """Second half: delta += (1 - gamma) * w_after; count the step."""
        g = self.state.gamma
        with torch.no_grad():
            for d, p in zip(self.state.delta, self.params.values()):
                d.add_(p.detach(), alpha=1.0 - g)
        self.steps += 1
        super().updated()

    def state_dict(self) -> dict[str, Any]:
        """Delta EMA, step count and base learning rates (the optimizer's saved lr is a scaled one)."""
        return {"pipemare": self.state.state_dict(), "steps": self.steps, "base_lrs": self._base_lrs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.state.load_state_dict(state["pipemare"])
        self.steps = int(state["steps"])
        self._base_lrs = state["base_lrs"]

    def weight_bytes(self) -> int:
        """Master weights plus the delta buffer (PipeMare's one extra weight-sized buffer)."""
        return sum(p.numel() * p.element_size() for p in self.params.values()) * 2


class WSPEndpoint(Protocol):
    """What a HetPipe policy needs from the parameter server (a WSPClient or an in-process adapter)."""

    def push(self, update: Mapping[str, torch.Tensor]) -> int: ...

    def pull(self) -> tuple[dict[str, torch.Tensor], int]: ...


class LocalWSP:
    """An in-process :class:`pipelab.runtime.wsp.WSPServer` seen as one VW's endpoint (reference executor)."""

    def __init__(self, server: Any, vw: int) -> None:
        self.server, self.vw = server, vw
        self.clock = 0

    def push(self, update: Mapping[str, torch.Tensor]) -> int:
        """Push to the shared server."""
        self.clock += 1
        return int(self.server.push(self.vw, update))

    #: the reference executor completes the pull later, when the staleness bound allows it
    deferred = True

    def pull(self) -> tuple[dict[str, torch.Tensor], int]:
        """Pull (raises if it would block: the reference executor checks :meth:`pull_would_wait` first)."""
        got = self.server.try_pull(self.vw)
        if got is None:
            raise RuntimeError(f"virtual worker {self.vw} would wait for the global clock; the reference "
                               "executor must check pull_would_wait() before completing the pull")
        return got  # type: ignore[no-any-return]

    def pull_would_wait(self) -> bool:
        """Whether a pull now would have to wait (local clock - global clock > D)."""
        return not self.server.may_start(self.vw)


class HetPipePolicy(VersionStore):
    """PipeDream stashing within a virtual worker + WSP every ``wave`` local updates (HetPipe §5)."""

    name = "hetpipe"

    def __init__(self, params: dict[str, nn.Parameter], stage: int, upcoming_input_versions: Iterable[int] = (), *,
                 wave: int) -> None:
        super().__init__(params, stage)
        if wave < 1:
            raise ValueError(f"wave={wave} must be >= 1 (minibatches per wave = the VW's NOAM)")
        self.wave = int(wave)
        self.endpoint: WSPEndpoint | None = None
        self.anchor: dict[str, torch.Tensor] = {n: p.detach().clone() for n, p in params.items()}
        self.pulls: list[tuple[int, int]] = []     # (local clock, global clock) at every pull

    def attach(self, endpoint: WSPEndpoint) -> None:
        """Connect to the parameter server (done by the runtime before the first action)."""
        self.endpoint = endpoint

    def forward_version(self, microbatch: int, upstream_version: int | None) -> int:
        """The newest local version (PipeDream inside the VW)."""
        self._current = self.epoch
        return self.latest

    def _needed_epochs(self) -> set[int]:
        return super()._needed_epochs() | {self.epoch}

    pull_pending = False
    #: called once after the next pull completes (the runtime checkpoints a drained wave's end there)
    after_pull: Callable[[], None] | None = None

    def state_dict(self) -> dict[str, Any]:
        """The local clock (waves pushed) and pulls so far; the weights are the module's.

        A checkpoint is taken only right after a wave's pull at a drained point, where the anchor
        equals the master weights (the runtime checks), so it is not saved separately.
        """
        return {"clock": self.latest // self.wave, "pulls": len(self.pulls)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume after a drained wave: the restored master weights are the last pull's (the anchor)."""
        with torch.no_grad():
            self.anchor = {n: p.detach().clone() for n, p in self.params.items()}

    def updated(self) -> None:
        """New local version; at a wave's end push the wave's update, then pull the global weights.

        A blocking endpoint (a worker process) pulls at once; a deferred one (the reference
        executor) leaves the pull pending until :meth:`pull_blocked` is false, and the executor runs
        no other action of this worker meanwhile - so both see the same weights.
        """
        super().updated()
        if self.latest % self.wave or self.endpoint is None:
            return
        with torch.no_grad():
            self.endpoint.push({n: p.detach() - self.anchor[n] for n, p in self.params.items()})
        self.pull_pending = True
        if not getattr(self.endpoint, "deferred", False):
            self.complete_pull()

    def pull_blocked(self) -> bool:
        """Whether a pending pull must still wait for the staleness bound."""
        return self.pull_pending and bool(self.endpoint.pull_would_wait())  # type: ignore[union-attr]

    def complete_pull(self) -> None:
        """Pull the global weights into the master weights (a new epoch of the same version)."""
        assert self.endpoint is not None
        pulled, g = self.endpoint.pull()
        with torch.no_grad():
            self.about_to_update()
            for n, p in self.params.items():
                p.copy_(pulled[n])
                self.anchor[n] = pulled[n].clone()
        self.pulls.append((self.latest // self.wave, g))
        self.pull_pending = False
        self._new_epoch(self.latest)
        hook, self.after_pull = self.after_pull, None
        if hook is not None:
            hook()

    def weight_bytes(self) -> int:
        """Stashed versions and master, plus the anchor (the weights of the last pull)."""
        anchor = getattr(self, "anchor", {})
        return super().weight_bytes() + sum(t.numel() * t.element_size() for t in anchor.values())


# ---------------------------------------------------------------------- registration
def _delayed_factory(method: str) -> Callable[[dict[str, Any]], Callable[..., WeightPolicy]]:
    def make(opts: dict[str, Any]) -> Callable[..., WeightPolicy]:
        sched = opts.get("schedule")
        d = int(sched.options["delay"]) if sched is not None and "delay" in sched.options \
            else delay_for(method, opts.get("versions"))
        M = int(opts.get("microbatches") or (sched.microbatches if sched is not None else 1))
        segs = sched.options.get("segments") if sched is not None else None
        return lambda params, stage, upcoming=(): DelayedVersions(params, stage, upcoming, delay=d, microbatches=M,
                                                                  segments=segs)
    return make


def _pipemare_factory(opts: dict[str, Any]) -> Callable[..., WeightPolicy]:
    cfg = PipeMareConfig(lr_reschedule=bool(opts.get("lr_reschedule", True)),
                         discrepancy_correction=bool(opts.get("discrepancy_correction", True)),
                         warmup_steps=int(opts.get("warmup_steps", 100)),
                         decay=float(opts.get("decay", 0.5)),
                         decay_from_delay=bool(opts.get("decay_from_delay", False)))
    sched = opts.get("schedule")
    # delays in optimizer steps, per stage, of this topology's steady state (a short run has none)
    taus: Mapping[int, tuple[int, int]] = opts.get("taus") or (
        steady_state_delays([len(r) for r in sched.stage_ranks]) if sched is not None else {})

    def build(params: dict[str, nn.Parameter], stage: int, upcoming: Sequence[int] = ()) -> WeightPolicy:
        tf, tb = taus.get(stage, (0, 0))
        return PipeMarePolicy(params, stage, upcoming, tau_fwd=tf, tau_bwd=tb, config=cfg)
    return build


def _hetpipe_factory(opts: dict[str, Any]) -> Callable[..., WeightPolicy]:
    sched = opts.get("schedule")
    wave = int(opts.get("wave") or (sched.options.get("wave", 1) if sched is not None else 1))
    if sched is not None:
        V = len(sched.stage_ranks[0])
        if sched.minibatches % (V * wave):
            raise ValueError(f"hetpipe with {V} virtual workers and waves of {wave} minibatches needs steps a "
                             f"multiple of {V * wave} (every virtual worker ends on a full wave); got "
                             f"{sched.minibatches}")
    return lambda params, stage, upcoming=(): HetPipePolicy(params, stage, upcoming, wave=wave)


register("2bw", _delayed_factory("2bw"))
register("buffered", _delayed_factory("buffered"))
register("pipemare", _pipemare_factory)
register("hetpipe", _hetpipe_factory)
