"""Weight policies: the interface, and the single-version, stashing and no-stash policies.

Version ``v`` of a stage is its weights after ``v`` updates of the master (the module's parameters).
A policy serves exactly the versions the schedule names, refuses one its method's weights cannot
give, and keeps exactly those still in flight or read by a forward to come. :class:`SingleVersion`
serves flushed methods; :class:`Stashing` is PipeDream's (SOSP'19, §3.3), optionally with vertical
sync; :class:`NoStash` is the naive-async ablation (§3), whose ``B`` recomputes on the newest
weights. Stashed versions are tensors of their own, so an in-place step never corrupts a graph.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from pipelab.schedules.worker_view import StageReads


class WeightPolicy:
    """Interface every policy implements (the runtime calls these around each action)."""

    name = "base"
    #: ``F`` builds an autograd graph (False: ``F`` runs under ``no_grad`` and ``B`` recomputes)
    forward_builds_graph = True
    #: the version an activation was computed with travels with it (vertical sync)
    sends_version = False

    def __init__(self, params: dict[str, nn.Parameter], stage: int, reads: StageReads | None = None) -> None:
        self.params = params
        self.stage = stage
        self.latest = 0
        self.in_flight: dict[int, int] = {}      # microbatch -> version its F read
        self.max_held = 1
        self.max_weight_bytes = 0     # measured at every change (subclasses may not be set up yet here)
        self.reads = reads if reads is not None else StageReads()
        self._next_forward = 0                   # forwards of self.reads.forward run so far
        self._future: Counter[int] = Counter(v for _, v in self.reads.forward)

    def scheduled_forward(self, microbatch: int) -> int:
        """The version the schedule names for this stage's next ``F`` (the newest without a schedule);
        raises when ``microbatch`` is not the schedule's next forward."""
        fw = self.reads.forward
        if not fw:
            return self.latest
        i = self._next_forward
        if i >= len(fw) or fw[i][0] != microbatch:
            want = f"microbatch {fw[i][0]}" if i < len(fw) else "none (all its forwards ran)"
            raise RuntimeError(f"stage {self.stage}: the runtime runs the forward of microbatch {microbatch} "
                               f"but the schedule's next forward on this stage is {want}")
        self._next_forward = i + 1
        v = fw[i][1]
        self._future[v] -= 1
        if not self._future[v]:
            del self._future[v]
        return v

    def scheduled_backward(self, microbatch: int, default: int) -> int:
        """The version the schedule says the backward (``B``/``W``) of ``microbatch`` reads."""
        return int(self.reads.backward.get(microbatch, default))

    def future_reads(self) -> set[int]:
        """Versions that forwards still to come on this stage read (from the schedule)."""
        return set(self._future)

    def _mismatch(self, what: str, microbatch: int, scheduled: int, holds: str) -> RuntimeError:
        return RuntimeError(f"stage {self.stage}: the schedule says the {what} of microbatch {microbatch} "
                            f"reads weight version {scheduled}, but this {self.name} policy {holds}; the "
                            "schedule's version rule and the method's weights disagree")

    def forward_version(self, microbatch: int, upstream_version: int | None) -> int:
        """The version ``F`` of ``microbatch`` reads: the schedule's, which must be the newest."""
        v = self.scheduled_forward(microbatch)
        if v != self.latest:
            raise self._mismatch("forward", microbatch, v, f"serves only the newest, {self.latest}")
        return v

    def weights(self, version: int) -> dict[str, torch.Tensor] | None:
        """Tensors to run with for ``version`` (name -> tensor), or None for the master weights."""
        return None

    def backward_version(self, microbatch: int) -> int:
        """The version ``B``/``W`` of ``microbatch`` reads: the one its ``F`` read, as the schedule says."""
        v = self.in_flight[microbatch]
        if not self.reads.single and self.scheduled_backward(microbatch, v) != v:
            raise self._mismatch("backward", microbatch, self.scheduled_backward(microbatch, v),
                                 f"kept the version its forward read, {v}")
        return v

    def forward_done(self, microbatch: int, version: int) -> None:
        """``F`` of ``microbatch`` ran with ``version``."""
        self.in_flight[microbatch] = version
        self._measure()

    def backward_done(self, microbatch: int) -> None:
        """The microbatch's last backward action (``B``, or ``W`` when split) on this stage ran."""
        self.in_flight.pop(microbatch, None)
        self._release()
        self._measure()

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Called at ``U`` with the gradients in place, before the optimizer steps."""

    def about_to_update(self) -> None:
        """Called right before the optimizer changes the master weights in place."""

    def state_dict(self) -> dict[str, Any]:
        """Method-specific state a checkpoint keeps (weights and optimizer are saved separately)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""

    def updated(self) -> None:
        """The optimizer just updated the master weights: a new version exists."""
        self.latest += 1
        self._release()
        self._measure()

    @property
    def held(self) -> int:
        """Distinct weight versions held right now."""
        return 1

    def weight_bytes(self) -> int:
        """Bytes of the distinct storages holding this stage's weights (master and any stashed)."""
        return distinct_bytes([self.params])

    def _release(self) -> None:
        pass

    def _holdings(self) -> tuple[int, tuple[int, ...], int]:
        """What :meth:`weight_bytes` depends on: the master's storage, the stash's keys, extra buffers."""
        p = next(iter(self.params.values()), None)
        stash = getattr(self, "stash", None)
        anchor = getattr(self, "anchor", None)
        return (p.untyped_storage().data_ptr() if p is not None else 0,
                tuple(stash) if stash is not None else (), len(anchor) if anchor else 0)

    def _measure(self) -> None:
        # runs after every action: recount the bytes only when what they depend on changed
        self.max_held = max(self.max_held, self.held)
        key = self._holdings()
        if key != getattr(self, "_measured", None):
            self._measured = key
            self.max_weight_bytes = max(getattr(self, "max_weight_bytes", 0), self.weight_bytes())


def distinct_bytes(sources: Iterable[Mapping[str, torch.Tensor]]) -> int:
    """Bytes of the distinct storages under the tensors of ``sources``."""
    seen: dict[int, int] = {}
    for src in sources:
        for t in src.values():
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def alias(p: torch.Tensor) -> torch.Tensor:
    """A new leaf tensor on ``p``'s storage with its own autograd version counter (no copy)."""
    t = torch.empty(0, dtype=p.dtype, device=p.device).set_(p.untyped_storage(), p.storage_offset(),
                                                            p.size(), p.stride())
    return t.requires_grad_(p.requires_grad)


class SingleVersion(WeightPolicy):
    """One version, updated at flushes: every action reads the master weights."""

    name = "single"

    def forward_version(self, microbatch: int, upstream_version: int | None) -> int:
        """The master weights (the schedule records version 0 for every read of a flushed method)."""
        return self.latest

    def updated(self) -> None:
        """Check that the pipeline is flushed, then count the new version."""
        if self.in_flight:
            raise RuntimeError(f"stage {self.stage}: weight update while microbatches "
                               f"{sorted(self.in_flight)} are in flight; a single-version method needs a "
                               "flush before U")
        super().updated()

    def _measure(self) -> None:
        # one version in storages that never move: measure once, not at every action (hot path)
        if not self.max_weight_bytes:
            super()._measure()


class Stashing(WeightPolicy):
    """PipeDream weight stashing, optionally with vertical sync (SOSP'19 §3.3).

    The newest version is stashed as an alias of the master; an update moves the master to fresh
    storage only while a stash still needs the old one (copy-on-write), so ``n`` versions cost ``n``
    weight copies.
    """

    name = "stashing"

    def __init__(self, params: dict[str, nn.Parameter], stage: int, reads: StageReads | None = None, *,
                 vertical_sync: bool = False) -> None:
        self.stash: dict[int, dict[str, torch.Tensor]] = {0: {n: alias(p) for n, p in params.items()}}
        super().__init__(params, stage, reads)
        self.vertical_sync = vertical_sync
        self.sends_version = vertical_sync

    def forward_version(self, microbatch: int, upstream_version: int | None) -> int:
        """The schedule's version: the newest, or with vertical sync the input stage's (which must agree)."""
        v = self.scheduled_forward(microbatch)
        if self.vertical_sync and upstream_version is not None and upstream_version != v:
            raise self._mismatch("forward", microbatch, v, f"received version {upstream_version} with it")
        if not self.vertical_sync and v != self.latest:
            raise self._mismatch("forward", microbatch, v, f"stashes from the newest, {self.latest}")
        if v not in self.stash:
            raise RuntimeError(f"stage {self.stage}: microbatch {microbatch} needs weight version {v} but "
                               f"this stage holds versions {sorted(self.stash)} (newest {self.latest}); the "
                               "schedule's version rule and the runtime disagree")
        return v

    def weights(self, version: int) -> dict[str, torch.Tensor] | None:
        """The stashed tensors of ``version``."""
        return self.stash[version]

    def _needed(self) -> set[int]:
        # in flight, or read by a forward still to come (vertical sync: the input stage's versions)
        return {*self.in_flight.values(), *self.future_reads()}

    def about_to_update(self) -> None:
        """Split the newest version off the master if someone still needs it (copy-on-write)."""
        if self.latest in self.stash:
            if self.latest in self._needed():
                with torch.no_grad():
                    for p in self.params.values():
                        p.data = p.data.clone()
            else:
                del self.stash[self.latest]

    def updated(self) -> None:
        """Stash the new version (an alias of the master) and drop versions nobody needs."""
        self.stash[self.latest + 1] = {n: alias(p) for n, p in self.params.items()}
        super().updated()

    def _release(self) -> None:
        keep = {self.latest, *self._needed()}
        for v in [v for v in self.stash if v not in keep]:
            del self.stash[v]

    @property
    def held(self) -> int:
        """Versions in the stash."""
        return len(self.stash)

    def weight_bytes(self) -> int:
        """Distinct storages of the master and the stash."""
        return distinct_bytes([self.params, *self.stash.values()])


class NoStash(WeightPolicy):
    """Naive asynchronous pipelining: forward and backward both read the newest weights (§3)."""

    name = "no-stash"
    forward_builds_graph = False

    def backward_version(self, microbatch: int) -> int:
        """The newest version (B recomputes the forward with it), as the schedule says."""
        v = self.scheduled_backward(microbatch, self.latest)
        if v != self.latest:
            raise self._mismatch("backward", microbatch, v, f"serves only the newest, {self.latest}")
        return v


PolicyFactory = Callable[..., WeightPolicy]
