"""A Profile's stages split over tensor groups: what one member computes and holds, and its collectives.

The split rule is the runtime's (:mod:`pipelab.tensor_split`), recorded per layer on the Profile by the
profiler (``Profile.tensor_splits``). For a stage of degree ``t``:

- a layer that divides (:attr:`LayerSplit.divides`) takes ``1/t`` of its measured time, less the part
  that does not shrink with the work (``fwd_fixed_s``/``bwd_fixed_s``, paid whole, as for a smaller
  batch); its FLOPs divide by ``t``;
- its cut weights (``split_param_bytes``) divide by ``t``; the rest stays whole on every member;
- a layer whose output is a shard keeps ``1/t`` of its saved activations and output;
- each of the group's collectives is priced over the group's devices with the cost model's ring
  (:meth:`CostModel.allreduce_s`, this machine's calibrated figures where the cluster has them); a
  ring all-gather moves half an all-reduce's bytes in half its steps (:func:`allgather_s`);
- the leader alone receives the stage's activations (``F``) and gradients (``B``) and broadcasts
  them to its group, as the runtime does (``pipelab.runtime.tensor_group``): a binomial tree of
  ``ceil(log2 t)`` point-to-point transfers (:func:`broadcast_s`).

:func:`per_device` applies the first three to the whole profile at once (each layer at its stage's
degree), so every other price of the cost model (compute, update, replica all-reduce of the member's
shard, memory) reads one member's share unchanged. What cannot be priced is refused by name
(:func:`check_priceable`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipelab.costs.prices import Prices
from pipelab.profile.records import Profile
from pipelab.tensor_split import LayerSplit
from pipelab.ties import Tie


@dataclass(frozen=True)
class GroupComm:
    """Seconds and bytes of one tensor group's collectives inside one ``F`` and one ``B`` of a microbatch."""

    forward_s: float
    backward_s: float
    forward_bytes: int
    backward_bytes: int
    collectives_forward: int
    collectives_backward: int


def layer_degrees(profile: Profile, ranges: Sequence[tuple[int, int]], degrees: Sequence[int]) -> list[int]:
    """Each layer's tensor degree: that of the stage (layer range) holding it."""
    out = [1] * len(profile)
    for (a, e), t in zip(ranges, degrees):
        out[a:e] = [t] * (e - a)
    return out


def check_priceable(profile: Profile, ranges: Sequence[tuple[int, int]], degrees: Sequence[int]) -> None:
    """Raise ``ValueError`` naming what keeps a stage of degree > 1 from being priced, and what to do."""
    split = [(s, r, t) for s, (r, t) in enumerate(zip(ranges, degrees)) if t > 1]
    if not split:
        return
    if not profile.tensor_splits:
        s, _, t = split[0]
        raise ValueError(
            f"stage {s} has tensor degree {t}, but profile {profile.model!r} records no tensor split: it "
            "does not say which layers a tensor group splits or where its all-reduces fall. Profile a model "
            "that declares tensor_parallel_plan (pipelab.runtime.tensor_parallel) with pl.profile, give "
            "the Profile tensor_splits (pipelab.tensor_split.LayerSplit per layer), or for a transformer "
            "by shape use pl.simulate_llm")
    for s, (a, e), t in split:
        for i in range(a, e):
            sp = profile.tensor_splits[i]
            if sp.kind == "unclassified":
                raise ValueError(f"stage {s} (tensor degree {t}) holds layer {i} "
                                 f"({profile.layers[i].name!r}), which the split rule cannot classify: "
                                 f"{sp.reason}")
        sizes = {k: v for i in range(a, e) for k, v in profile.tensor_splits[i].sizes}
        wrong = {k: v for k, v in sizes.items() if v % t}
        if wrong:
            g = math.gcd(*sizes.values())
            valid = [d for d in range(1, g + 1) if g % d == 0]
            first = ", ".join(f"{k} ({v})" for k, v in list(wrong.items())[:4])
            raise ValueError(f"stage {s}: tensor degree {t} does not divide {first}; valid degrees for its "
                             f"layers: {valid}")
        if e < len(profile) and profile.tensor_splits[e - 1].gives_shards:
            raise ValueError(f"stage {s} (tensor degree {t}) ends after layer {e - 1} "
                             f"({profile.layers[e - 1].name!r}), whose output is a shard of the group: only "
                             "whole activations cross stages; end the stage after a row-parallel layer")
        if a > 0 and profile.tensor_splits[a - 1].gives_shards:
            raise ValueError(f"stage {s} (tensor degree {t}) starts after layer {a - 1} "
                             f"({profile.layers[a - 1].name!r}), whose output is a shard of the group")


def _divided(total: float, fixed: float, t: int) -> float:
    return fixed + (total - fixed) / t


def per_device(profile: Profile, degrees: Sequence[int]) -> Profile:
    """``profile`` as one member of each layer's tensor group sees it (``degrees[i]``: layer ``i``'s)."""
    if all(t == 1 for t in degrees):
        return profile
    layers = []
    for ly, sp, t in zip(profile.layers, profile.tensor_splits, degrees):
        if t == 1:
            layers.append(ly)
            continue
        params = ly.param_bytes - sp.split_param_bytes + sp.split_param_bytes // t
        if not sp.divides:
            layers.append(replace(ly, param_bytes=params))
            continue
        f, b = _divided(ly.fwd_s, ly.fwd_fixed_s, t), _divided(ly.bwd_s, ly.bwd_fixed_s, t)
        shard = t if sp.gives_shards else 1
        layers.append(replace(
            ly, fwd_s=f, bwd_s=b, flops=ly.flops // t, param_bytes=params,
            wgrad_s=None if ly.wgrad_s is None or not ly.bwd_s else ly.wgrad_s * b / ly.bwd_s,
            saved_bytes=ly.saved_bytes // shard, out_bytes=ly.out_bytes // shard))
    ties = tuple(_tie(tie, profile.tensor_splits, degrees) for tie in profile.ties)
    return replace(profile, layers=tuple(layers), ties=ties)


def _tie(tie: Tie, splits: Sequence[LayerSplit], degrees: Sequence[int]) -> Tie:
    """A shared parameter's bytes on one member: a shard where its first user cuts it (the runtime
    refuses users that cut it differently)."""
    first = tie.layers[0]
    t = degrees[first]
    if t > 1 and splits[first].split_param_bytes > 0:
        return replace(tie, nbytes=tie.nbytes // t)
    return tie


def allgather_s(prices: Prices, nbytes: int, workers: Sequence[int]) -> float:
    """Seconds of a ring all-gather of ``nbytes`` (the gathered total) over ``workers``: ``p - 1`` steps
    moving ``(p - 1) / p`` of the bytes, half an all-reduce's ``2 (p - 1)`` steps and bytes."""
    return prices.allreduce_s(nbytes, workers) / 2


def broadcast_s(prices: Prices, nbytes: int, group: Sequence[int]) -> float:
    """Seconds of the leader ``group[0]`` broadcasting ``nbytes`` to ``group``: ``ceil(log2 t)`` rounds of a
    binomial tree, each one point-to-point transfer over the group's slowest link, uncompressed (the
    runtime broadcasts the received tensors as they are)."""
    if len(group) < 2 or nbytes == 0:
        return 0.0
    rounds = math.ceil(math.log2(len(group)))
    links = [prices.cluster.link(group[0], d) for d in group[1:]]
    slowest = max(lv.latency + nbytes / lv.transfer_bandwidth for lv in links)
    return rounds * (slowest + prices.staging_s(nbytes))


def group_comm(prices: Prices, profile: Profile, start: int, end: int, group: Sequence[int],
               microbatches: int) -> GroupComm:
    """The collectives of layers ``[start, end)`` over the tensor group on devices ``group``, per microbatch:
    each all-reduce (all-gather) of the recorded bytes divided by ``microbatches``, priced one by one,
    and the broadcast of what the leader receives (activations into ``F``, gradients into ``B``)."""
    fwd = bwd = 0.0
    fb = bb = nf = nb = 0
    if start > 0:
        n = -(-profile.cut_bytes[start - 1] // microbatches)
        fwd, fb, nf = broadcast_s(prices, n, group), n, 1
    if end < len(profile):
        n = -(-profile.cut_bytes[end - 1] // microbatches)
        bwd, bb, nb = broadcast_s(prices, n, group), n, 1
    for sp in profile.tensor_splits[start:end]:
        for nbytes, gather in ((sp.forward_allreduce_bytes, False), (sp.forward_allgather_bytes, True)):
            if nbytes:
                n = -(-nbytes // microbatches)
                fwd += allgather_s(prices, n, group) if gather else prices.allreduce_s(n, group)
                fb, nf = fb + n, nf + 1
        if sp.backward_allreduce_bytes:
            n = -(-sp.backward_allreduce_bytes // microbatches)
            bwd += prices.allreduce_s(n, group)
            bb, nb = bb + n, nb + 1
    return GroupComm(forward_s=fwd, backward_s=bwd, forward_bytes=fb, backward_bytes=bb,
                     collectives_forward=nf, collectives_backward=nb)
