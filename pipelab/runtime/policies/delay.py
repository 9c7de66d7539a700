"""Delayed weight versions: PipeDream-2BW and Lv et al.'s bounded buffer of K versions.

Minibatch ``k`` reads version ``max(0, k - d)``: ``d = 1`` for 2BW (Narayanan et al., ICML'21, §3),
``d = K - 1`` for the bounded buffer (CCGrid'23). Invariant: a version equal to the master aliases
its storage until the step (copy-on-write), so ``n`` versions held are ``n`` weight copies.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pipelab.runtime.policies.base import WeightPolicy, alias, distinct_bytes
from pipelab.schedules.versions import delayed_rule
from pipelab.schedules.worker_view import StageReads


def delayed_version(minibatch: int, delay: int) -> int:
    """Version read by every action of ``minibatch`` under a ``delay``-step rule: ``max(0, k - d)``."""
    if delay < 0:
        raise ValueError(f"delay={delay} must be >= 0")
    return delayed_rule(minibatch, delay)


def delayed_sgd(w0: torch.Tensor, grad: Callable[[int, torch.Tensor], torch.Tensor], lr: float, steps: int,
                delay: int) -> list[torch.Tensor]:
    """``[W(0), ..., W(steps)]`` of ``W(t+1) = W(t) - lr * grad(t, W(max(0, t - delay)))``."""
    ws = [w0.clone()]
    for t in range(steps):
        ws.append(ws[t] - lr * grad(t, ws[delayed_version(t, delay)]))
    return ws


class VersionStore(WeightPolicy):
    """Stashed versions keyed by epoch (every change of the master), copy-on-write, distinct-storage bytes."""

    name = "store"

    def __init__(self, params: dict[str, nn.Parameter], stage: int, reads: StageReads | None = None) -> None:
        super().__init__(params, stage, reads)
        self.epoch = 0
        self.epoch_version: dict[int, int] = {0: 0}
        self.stash: dict[int, dict[str, torch.Tensor]] = {}
        self.in_flight_epoch: dict[int, int] = {}
        self.max_weight_bytes = self.weight_bytes()

    def _aliases_master(self, e: int) -> bool:
        st = self.stash.get(e)
        if not st:
            return False
        n, t = next(iter(st.items()))
        return t.untyped_storage().data_ptr() == self.params[n].untyped_storage().data_ptr()

    def _tensors(self, e: int) -> dict[str, torch.Tensor]:
        if e not in self.stash:
            if e != self.epoch:
                raise RuntimeError(f"stage {self.stage}: weights of epoch {e} (version "
                                   f"{self.epoch_version.get(e)}) are no longer held (held: "
                                   f"{sorted(self.stash)}, current {self.epoch})")
            self.stash[e] = {n: alias(p) for n, p in self.params.items()}
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

    def weight_bytes(self) -> int:
        """Bytes of distinct storages among the master weights and every stashed version."""
        return distinct_bytes([self.params, *self.stash.values()])

    @property
    def held(self) -> int:
        """Distinct weight versions held (stashed ones plus the master's)."""
        return len(set(self.stash) | {self.epoch})

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
        v = self.epoch_version[self._current]
        if self.scheduled_backward(microbatch, v) != v:
            raise self._mismatch("backward", microbatch, self.scheduled_backward(microbatch, v),
                                 f"kept the version its forward read, {v}")
        return v

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
    """2BW / bounded buffer: serves the versions the schedule names, keeps those still needed."""

    name = "delayed"

    def _epoch_of_version(self, v: int) -> int:
        for e, ver in self.epoch_version.items():
            if ver == v:
                return e
        raise RuntimeError(f"stage {self.stage}: version {v} is needed but no longer held (held "
                           f"{sorted(self.epoch_version.values())}, newest {self.latest}); the schedule's "
                           "versions and this policy disagree")

    def forward_version(self, microbatch: int, upstream_version: int | None) -> int:
        """The schedule's version for this forward (an older one, or the newest)."""
        v = self.scheduled_forward(microbatch)
        if v > self.latest:
            raise self._mismatch("forward", microbatch, v, f"has made only {self.latest} updates (the "
                                 "schedule runs the forward too early)")
        self._current = self._epoch_of_version(v)
        return v

    def _needed_epochs(self) -> set[int]:
        later = self.future_reads()
        return super()._needed_epochs() | {e for e, v in self.epoch_version.items() if v in later}

    def about_to_update(self) -> None:
        """Drop versions no action reads again; keep the newest if a forward still to come reads it."""
        self._release()
        if self.latest in self.future_reads():
            self._tensors(self.epoch)
        super().about_to_update()
