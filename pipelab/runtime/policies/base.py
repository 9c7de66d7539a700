"""Weight policies: which version of a stage's weights each forward and backward reads.

A stage's *master* weights are its module's parameters; the optimizer updates them in place at
every ``U``, and version ``v`` means "after ``v`` updates on this stage". A policy decides, per
microbatch, which version its ``F`` and its ``B``/``W`` read, and keeps exactly the versions some
in-flight or future microbatch still needs (the number it holds is measured, see :attr:`held`).

* :class:`SingleVersion` — flushed methods (``gpipe``, ``1f1b-flush``, ``interleaved-1f1b``,
  ``zb-h1``, ``dp``): every action reads the master weights; an update while a microbatch is in
  flight would be a schedule bug and raises.
* :class:`Stashing` — PipeDream's weight stashing (Narayanan et al., SOSP'19, §3.3): ``F`` reads the
  newest version and stashes it; the microbatch's ``B`` computes gradients against that same
  stashed version; the update is applied to the newest (master) weights. With ``vertical_sync``
  every stage reads the version the *input stage* used for the microbatch, which travels with the
  activations (§3.3, "vertical sync").
* :class:`NoStash` — the naive-async ablation (§3): ``F`` and ``B`` both read the newest weights;
  ``B`` recomputes the stage's forward from the microbatch's saved inputs with the weights current
  at ``B`` time, so the gradient is exactly "the newest weights' gradient at those inputs".

Stashed versions are separate tensors (clones taken when an update creates a version), never the
master parameters, so an in-place optimizer step cannot corrupt a saved autograd graph.

The other policies live beside this module in :mod:`pipelab.runtime.policies`, whose table maps
each :attr:`pipelab.methods.Method.weights` key to one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn


class WeightPolicy:
    """Interface every policy implements (the runtime calls these around each action)."""

    name = "base"
    #: ``F`` builds an autograd graph (False: ``F`` runs under ``no_grad`` and ``B`` recomputes)
    forward_builds_graph = True
    #: the version an activation was computed with travels with it (vertical sync)
    sends_version = False

    def __init__(self, params: dict[str, nn.Parameter], stage: int,
                 upcoming_input_versions: Iterable[int] = ()) -> None:
        self.params = params
        self.stage = stage
        self.latest = 0
        self.in_flight: dict[int, int] = {}      # microbatch -> version its F read
        self.max_held = 1
        self.max_weight_bytes = 0     # measured at every change (subclasses may not be set up yet here)

    # -- what the runtime asks
    def forward_version(self, microbatch: int, upstream_version: int | None) -> int:
        """The version ``F`` of ``microbatch`` reads (``upstream_version``: the one sent with it)."""
        return self.latest

    def weights(self, version: int) -> dict[str, torch.Tensor] | None:
        """Tensors to run with for ``version`` (name -> tensor), or None for the master weights."""
        return None

    def backward_version(self, microbatch: int) -> int:
        """The version ``B``/``W`` of ``microbatch`` reads."""
        return self.in_flight[microbatch]

    # -- what the runtime tells it
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
        """Called at ``U`` with the final gradients in place, before the optimizer steps (e.g. to set
        this step's learning rate)."""

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
        return _distinct_bytes([self.params])

    # -- internals
    def _release(self) -> None:
        pass

    def _measure(self) -> None:
        self.max_held = max(self.max_held, self.held)
        self.max_weight_bytes = max(getattr(self, "max_weight_bytes", 0), self.weight_bytes())


def _distinct_bytes(sources: Iterable[Mapping[str, torch.Tensor]]) -> int:
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

    def updated(self) -> None:
        """Check that the pipeline is flushed, then count the new version."""
        if self.in_flight:
            raise RuntimeError(
                f"stage {self.stage}: weight update while microbatches {sorted(self.in_flight)} are in "
                "flight; "
                "a single-version method needs a flush before U (the schedule is not flushed)"
            )
        super().updated()

    def _measure(self) -> None:
        # one version in storages that never move: measure once, not at every action (hot path)
        if not self.max_weight_bytes:
            super()._measure()


class Stashing(WeightPolicy):
    """PipeDream weight stashing, optionally with vertical sync (SOSP'19 §3.3).

    The newest version is stashed as an *alias* of the master weights (no copy); right before an
    update, if an in-flight or upcoming microbatch still needs it, the master moves to fresh
    storage and the stash keeps the old one (copy-on-write). So ``n`` versions held cost exactly
    ``n`` copies of the stage's weights (measured by :meth:`weight_bytes`).
    """

    name = "stashing"

    def __init__(self, params: dict[str, nn.Parameter], stage: int,
                 upcoming_input_versions: Iterable[int] = (), *, vertical_sync: bool = False) -> None:
        self.stash: dict[int, dict[str, torch.Tensor]] = {0: {n: alias(p) for n, p in params.items()}}
        super().__init__(params, stage)
        self.vertical_sync = vertical_sync
        self.sends_version = vertical_sync
        # versions the input stage used for the microbatches this stage will still forward, in
        # order: a vertically synced stage must keep them until their forward arrives
        self.upcoming: deque[int] = deque(upcoming_input_versions) if vertical_sync else deque()

    def forward_version(self, microbatch: int, upstream_version: int | None) -> int:
        """Newest version, or with vertical sync the input stage's version for the microbatch."""
        if self.vertical_sync and upstream_version is not None:
            if self.upcoming:
                self.upcoming.popleft()
            v = upstream_version
        else:
            v = self.latest
        if v not in self.stash:
            raise RuntimeError(
                f"stage {self.stage}: microbatch {microbatch} needs weight version {v} but this "
                f"stage holds versions {sorted(self.stash)} (newest {self.latest}); the schedule's "
                "version rule and the runtime disagree"
            )
        return v

    def weights(self, version: int) -> dict[str, torch.Tensor] | None:
        """The stashed tensors of ``version``."""
        return self.stash[version]

    def _needed(self) -> set[int]:
        return {*self.in_flight.values(), *self.upcoming}

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
        self.latest += 1
        self.stash[self.latest] = {n: alias(p) for n, p in self.params.items()}
        self._release()
        self._measure()

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
        return _distinct_bytes([self.params, *self.stash.values()])


class NoStash(WeightPolicy):
    """Naive asynchronous pipelining: forward and backward both read the newest weights (§3)."""

    name = "no-stash"
    forward_builds_graph = False

    def backward_version(self, microbatch: int) -> int:
        """The newest version (B recomputes the forward with it)."""
        return self.latest


PolicyFactory = Callable[..., WeightPolicy]
