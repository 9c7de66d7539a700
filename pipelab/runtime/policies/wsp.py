"""HetPipe's weight policy: stashing inside a virtual worker, push/pull every ``wave`` updates.

Park et al., ATC'20; the server is :mod:`pipelab.runtime.param_server`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
from torch import nn

from pipelab.runtime.policies.delay import VersionStore
from pipelab.schedules.worker_view import StageReads


class WSPEndpoint(Protocol):
    """What a HetPipe policy needs from the parameter server (a WSPClient or an in-process adapter)."""

    def push(self, update: Mapping[str, torch.Tensor]) -> int: ...

    def pull(self) -> tuple[dict[str, torch.Tensor], int]: ...


class LocalWSP:
    """An in-process :class:`~pipelab.runtime.param_server.WSPServer` as one VW's endpoint."""

    def __init__(self, server: Any, vw: int) -> None:
        self.server, self.vw = server, vw

    def push(self, update: Mapping[str, torch.Tensor]) -> int:
        """Push to the shared server."""
        return int(self.server.push(self.vw, update))

    #: the reference executor completes the pull later, when the staleness bound allows it
    deferred = True

    def pull(self) -> tuple[dict[str, torch.Tensor], int]:
        """Pull (raises if it would block: the reference executor checks :meth:`pull_would_wait` first)."""
        got = self.server.try_pull(self.vw)
        if got is None:
            raise RuntimeError(f"virtual worker {self.vw} would wait for the global clock; the reference "
                               "executor must check pull_would_wait() before completing the pull")
        return got

    def pull_would_wait(self) -> bool:
        """Whether a pull now would have to wait (local clock - global clock > D)."""
        return not self.server.may_start(self.vw)


class HetPipePolicy(VersionStore):
    """PipeDream stashing within a virtual worker + WSP every ``wave`` local updates (HetPipe §5)."""

    name = "hetpipe"

    def __init__(self, params: dict[str, nn.Parameter], stage: int, reads: StageReads | None = None, *,
                 wave: int) -> None:
        super().__init__(params, stage, reads)
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
        """The newest local version (PipeDream inside the VW), as the schedule says."""
        v = self.scheduled_forward(microbatch)
        if v != self.latest:
            raise self._mismatch("forward", microbatch, v, f"stashes from the newest, {self.latest}")
        self._current = self.epoch
        return v

    def _needed_epochs(self) -> set[int]:
        return super()._needed_epochs() | {self.epoch}

    pull_pending = False
    #: called once after the next pull completes (the runtime checkpoints a drained wave's end there)
    after_pull: Callable[[], None] | None = None

    def state_dict(self) -> dict[str, Any]:
        """The local clock and pulls so far (taken right after a pull, where the anchor is the master)."""
        return {"clock": self.latest // self.wave, "pulls": len(self.pulls)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume after a drained wave: the restored master weights are the last pull's (the anchor)."""
        with torch.no_grad():
            self.anchor = {n: p.detach().clone() for n, p in self.params.items()}

    def updated(self) -> None:
        """New local version; at a wave's end push the update, then pull (the reference executor defers)."""
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
