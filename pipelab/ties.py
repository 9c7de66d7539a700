"""Shared (tied) parameters: one tensor that two or more layers use, found in the traced layer graph.

A *tie* is a parameter object used by several layers, whatever names it goes by: GPT-2's and
nanoGPT's output head reuses the token embedding's matrix (``head.weight is wte.weight``), T5 does
the same, and a module called twice shares all its weights between its two layers. Detection is by
object identity, never by name, so a stage that knows the matrix only as ``head.weight`` still ties
with the stage that knows it as ``wte.weight``.

Invariants: a :class:`Tie` lists every name of the tensor (sorted), the layers that use it (sorted,
two or more) and its bytes; ties are ordered by their first name. When a partition puts a tie's layers
on two or more stages, every stage holding it keeps a copy, and synchronous training keeps the copies
equal by summing their gradients before one identical update (``pipelab.runtime.ties``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx as fx
from torch import nn

import pipelab.methods as methods
from pipelab.graph import StageModule, layer_members


@dataclass(frozen=True)
class Tie:
    """One parameter that several layers use: its names, the layers using it, its bytes."""

    names: tuple[str, ...]
    layers: tuple[int, ...]
    nbytes: int
    shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(sorted(str(n) for n in self.names)))
        object.__setattr__(self, "layers", tuple(sorted({int(i) for i in self.layers})))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if not self.names:
            raise ValueError("a Tie needs at least one parameter name")
        if len(self.layers) < 2:
            raise ValueError(f"tie {self.name!r} lists layers {list(self.layers)}; a tie is used by two or "
                             "more layers")
        if self.layers[0] < 0 or self.nbytes < 0:
            raise ValueError(f"tie {self.name!r}: layers and nbytes must be >= 0")

    @property
    def name(self) -> str:
        """The tie's display name: its names joined by ``=`` (``head.weight=wte.weight``)."""
        return "=".join(self.names)

    def stages(self, ranges: Sequence[tuple[int, int]]) -> tuple[int, ...]:
        """Indices of the stages (layer ranges ``[start, end)``) that hold a copy: those with a user layer."""
        return tuple(s for s, (a, b) in enumerate(ranges) if any(a <= i < b for i in self.layers))

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {"names": list(self.names), "layers": list(self.layers), "nbytes": self.nbytes,
                "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Tie:
        """Inverse of :meth:`to_dict`."""
        try:
            return cls(names=tuple(d["names"]), layers=tuple(d["layers"]), nbytes=int(d["nbytes"]),
                       shape=tuple(d.get("shape", ())))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed tie record ({exc}): it needs names, layers and nbytes") from None


def _attr(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def layer_parameters(gm: fx.GraphModule) -> list[list[nn.Parameter]]:
    """For every layer of ``gm`` (as :func:`pipelab.graph.layer_members`), the parameters it uses: those
    of the modules it calls and those it reads through ``get_attr`` (each object once)."""
    out: list[list[nn.Parameter]] = []
    for members in layer_members(gm):
        seen: dict[int, nn.Parameter] = {}
        for node in members:
            if node.op == "call_module":
                for p in gm.get_submodule(str(node.target)).parameters():
                    seen.setdefault(id(p), p)
            for inp in node.all_input_nodes:
                if inp.op == "get_attr":
                    value = _attr(gm, str(inp.target))
                    params = ([value] if isinstance(value, nn.Parameter) else
                              list(value.parameters()) if isinstance(value, nn.Module) else [])
                    for p in params:
                        seen.setdefault(id(p), p)
        out.append(list(seen.values()))
    return out


def find_ties(gm: fx.GraphModule) -> tuple[Tie, ...]:
    """Every parameter of the traced model ``gm`` that two or more of its layers use (by object identity)."""
    users: dict[int, list[int]] = {}
    objects: dict[int, nn.Parameter] = {}
    for layer, params in enumerate(layer_parameters(gm)):
        for p in params:
            users.setdefault(id(p), []).append(layer)
            objects[id(p)] = p
    names: dict[int, list[str]] = {}
    for n, p in gm.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    ties = [Tie(names=tuple(names.get(k, [f"<unnamed {tuple(objects[k].shape)}>"])), layers=tuple(layers),
                nbytes=objects[k].numel() * objects[k].element_size(), shape=tuple(objects[k].shape))
            for k, layers in users.items() if len(set(layers)) >= 2]
    return tuple(sorted(ties, key=lambda t: t.names))


def across_stages(ties: Sequence[Tie],
                  ranges: Sequence[tuple[int, int]]) -> tuple[tuple[Tie, tuple[int, ...]], ...]:
    """The ties whose users fall in two or more of the stages ``ranges``, each with those stages."""
    out = []
    for t in ties:
        stages = t.stages(ranges)
        if len(stages) >= 2:
            out.append((t, stages))
    return tuple(out)


def describe_tie(tie: Tie, stages: Sequence[int]) -> str:
    """One line: the tie's names, size, and the stages holding a copy."""
    return (f"parameter {tie.name} ({'x'.join(map(str, tie.shape)) or '?'}, {tie.nbytes:,} bytes) is used "
            f"by layers {list(tie.layers)} on stages {list(stages)}")


@dataclass(frozen=True)
class StageTie:
    """A parameter that the stage modules of two or more stages hold (the same tensor object): the stages,
    the name each stage's module gives it, its bytes and shape."""

    names: tuple[tuple[int, str], ...]     # (stage, the name under which that stage's module holds it)
    nbytes: int
    shape: tuple[int, ...]

    @property
    def stages(self) -> tuple[int, ...]:
        """The stages holding a copy, ascending."""
        return tuple(s for s, _ in self.names)

    @property
    def name(self) -> str:
        """Its names joined by ``=`` (``head.weight=wte.weight``)."""
        return "=".join(sorted({n.removeprefix("graph_module.") for _, n in self.names}))

    def name_on(self, stage: int) -> str:
        """The name stage ``stage``'s module gives the parameter."""
        return dict(self.names)[stage]


def stage_ties(gm: fx.GraphModule, ranges: Sequence[tuple[int, int]]) -> tuple[StageTie, ...]:
    """Every parameter that the stage modules cut from ``gm`` at ``ranges`` share (object identity).

    This reads the modules a run actually builds (:class:`pipelab.graph.StageModule`), so a tie is found
    whatever each stage calls it."""
    holders: dict[int, list[tuple[int, str]]] = {}
    objects: dict[int, nn.Parameter] = {}
    for s, (a, b) in enumerate(ranges):
        seen: set[int] = set()
        for n, p in StageModule(gm, a, b).named_parameters(remove_duplicate=False):
            if id(p) not in seen:
                seen.add(id(p))
                holders.setdefault(id(p), []).append((s, n))
                objects[id(p)] = p
    out = [StageTie(names=tuple(h), nbytes=objects[k].numel() * objects[k].element_size(),
                    shape=tuple(objects[k].shape)) for k, h in holders.items() if len(h) >= 2]
    return tuple(sorted(out, key=lambda t: (t.stages, t.name)))


class TieError(ValueError):
    """A shared parameter the chosen method or schedule cannot keep as one weight."""


def version_split(tie: StageTie, schedule: Any) -> str:
    """Why ``schedule`` cannot keep ``tie`` one weight ("" when it can): every holding stage must read the
    same version for each microbatch (the versions the schedule names) and update once per minibatch.
    ``schedule`` is a :class:`pipelab.schedules.Schedule` (read by its fields: this layer is below it)."""
    if schedule.versions is None:
        return ""
    if methods.get(schedule.method).update != "minibatch":
        return "its stages update after every microbatch, each at its own time"
    read: dict[int, tuple[int, int]] = {}    # microbatch -> (stage, version) first seen
    for w, acts in enumerate(schedule.actions):
        for a, v in zip(acts, schedule.versions[w]):
            if a.kind in ("F", "B", "W") and a.stage in tie.stages:
                s0, v0 = read.setdefault(a.microbatch, (a.stage, v))
                if v0 != v:
                    return (f"microbatch {a.microbatch} reads version {v0} on stage {s0} but version {v} on "
                            f"stage {a.stage}")
    return ""


def check_tie_method(ties: Sequence[StageTie], schedule: Any) -> None:
    """Refuse a schedule that cannot keep a shared parameter one weight (names it, why, and what to do).

    Synchronous methods always can; an asynchronous one can when every holding stage reads the same
    version of each microbatch and all update once per minibatch (2BW and the bounded buffer: minibatch
    ``t`` reads ``W(t - d)`` on every stage), so the summed gradient is the whole model's at that version.
    """
    method = schedule.method
    if not ties or methods.get(method).synchronous:
        return
    for t in ties:
        why = version_split(t, schedule)
        if not why:
            continue
        sync = ", ".join(m.name for m in methods.METHODS.values() if m.synchronous)
        more = f" (and {len(ties) - 1} more shared parameter(s))" if len(ties) > 1 else ""
        raise TieError(
            f"parameter {t.name} ({'x'.join(map(str, t.shape))}) is shared by stages {list(t.stages)}{more}, "
            f"and method {method!r} is asynchronous: {why}, so each stage's copy would follow its own "
            "versions, silently untying it. Untie it (give each user its own weight), train with a "
            f"synchronous method ({sync}) or one whose stages read one version per minibatch (2bw, "
            "buffered), or keep every user of it on one stage (a plan whose stage spans those layers)")
