"""Only legal cuts: a boundary a non-tensor value crosses is never cut by any partitioner or plan.

Oracles: brute force over every legal cut set on small synthetic profiles, and a nanoGPT-style model
whose blocks read ``b, s, _ = x.shape`` (fx makes the shape a layer whose ints are used later).
"""

import dataclasses
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import pipelab as pl
from pipelab.cluster import Cluster, Device, Level
from pipelab.costs import CostModel
from pipelab.partition import partition
from pipelab.partition.balance import balance_by_time
from pipelab.partition.pipedream import solve
from pipelab.partition.plan import Plan
from pipelab.profile.records import BlockedCut, Profile


def free_cluster(workers):
    devs = tuple(Device(f"g{s}", 1.0, 2**40) for s in range(workers))
    return Cluster("free", (Level("free", workers, math.inf, 0.0),), devs)


def legal_compositions(n, parts, legal):
    """Layer counts of every split of ``n`` layers into ``parts`` stages starting only where ``legal``."""
    inner = [i for i in range(1, n) if legal[i]]
    for cuts in itertools.combinations(inner, parts - 1):
        b = [0, *cuts, n]
        yield [y - x for x, y in zip(b, b[1:])]


def blocked_profile(ts, bw, blocked):
    n = len(ts)
    cuts = tuple(BlockedCut(boundary=b, value=f"size_{b}", kind="int", producer=f"layer{b}",
                            users=(f"layer{min(b + 1, n - 1)}",)) for b in sorted(blocked))
    return Profile.synthetic(ts, bw, param_bytes=[10**6] * n, out_bytes=[10**6] * n, blocked_cuts=cuts)


profiles = st.integers(2, 7).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0.01, 10.0), min_size=n, max_size=n),
    st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n),
    st.sets(st.integers(0, n - 2))))


@settings(max_examples=60, deadline=None)
@given(prof=profiles, workers=st.integers(1, 4))
def test_partitioners_match_brute_force_over_legal_cuts(prof, workers):
    ts, bw, blocked = prof
    p = blocked_profile(ts, bw, blocked)
    n, legal = len(ts), p.legal_starts()
    assert [i for i in range(1, n) if not legal[i]] == sorted(b + 1 for b in blocked)
    comp = [f + b for f, b in zip(ts, bw)]
    c = free_cluster(workers)

    def loads(sizes, reps):
        out, a = [], 0
        for sz, r in zip(sizes, reps):
            out.append(sum(comp[a:a + sz]) / r)
            a += sz
        return max(out)

    def reps_of(S):
        return (list(r) for r in itertools.product(range(1, workers + 1), repeat=S) if sum(r) == workers)

    best = min(loads(sz, r) for S in range(1, min(n, workers) + 1)
               for sz in legal_compositions(n, S, legal) for r in reps_of(S))
    total, bounds, _ = solve(CostModel(p, c))
    assert total == pytest.approx(best, rel=1e-9)
    assert all(legal[b] for b in bounds)
    plan = partition(p, c, "pipedream")
    assert all(legal[s.start] for s in plan.stages)
    plan.validate(p)
    for S in range(1, min(workers, n) + 1):
        straight = [loads(sz, [1] * S) for sz in legal_compositions(n, S, legal)]
        if not straight:     # too few legal cuts: every partitioner refuses, naming why
            with pytest.raises(ValueError, match="legal"):
                partition(p, c, "prefix-sum", stages=S, buffers=None)
            with pytest.raises(ValueError, match="legal"):
                balance_by_time(S, comp, legal=legal)
            continue
        sizes = balance_by_time(S, comp, legal=legal)
        assert len(sizes) == S and loads(sizes, [1] * S) == pytest.approx(min(straight), rel=1e-9)
        ps = partition(p, c, "prefix-sum", stages=S, buffers=None)
        assert ps.notes["bottleneck_s"] == pytest.approx(min(straight), rel=1e-9)
        gp = partition(p, c, "gpipe", stages=S, microbatches=1)
        for pl_ in (ps, gp):
            assert all(legal[s.start] for s in pl_.stages)


def test_plan_from_boundaries_refuses_an_illegal_cut_by_name():
    p = blocked_profile([1.0] * 4, [2.0] * 4, {1})
    with pytest.raises(ValueError,
                       match=r"layer 2 \('layer2'\).*'size_1' \(int, not a tensor\).*legal layers \(1, 3\)"):
        Plan.from_boundaries(4, [2], profile=p)
    plan = Plan.from_boundaries(4, [3], profile=p)
    assert plan.profile_fingerprint == p.fingerprint()
    with pytest.raises(ValueError, match="cannot start at layer 2"):
        Plan.from_boundaries(4, [2]).validate(p)
    # the record survives JSON
    assert Profile.from_dict(p.to_dict()) == p


class Block(nn.Module):
    """A nanoGPT-style block that reads its input's shape at the top and uses it at the end."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(x)


class TinyGPT(nn.Module):
    def __init__(self, vocab=23, d=16, blocks=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(*[Block(d) for _ in range(blocks)])
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        return self.head(self.blocks(self.emb(ids)))


def test_shape_ints_block_cuts_and_every_returned_plan_trains():
    """The repro: the ints of ``x.shape`` cross many boundaries; partitions avoid all of them and train."""
    torch.manual_seed(0)
    ids = torch.randint(0, 23, (4, 8))
    measured = pl.profile(TinyGPT(), ids, repeats=1, warmup=0, progress=False, small_batch=None, whole=False)
    # equal layer times: the partitions below do not depend on this machine's timings
    prof = dataclasses.replace(measured, layers=tuple(
        dataclasses.replace(ly, fwd_s=1e-3, bwd_s=2e-3, fwd_fixed_s=0.0, bwd_fixed_s=0.0, wgrad_s=None)
        for ly in measured.layers))
    assert prof.blocked_cuts and {c.kind for c in prof.blocked_cuts} <= {"int", "Size", "tuple", "list"}
    assert any(len(c.users) and c.users[0] != prof.layers[c.boundary + 1].name for c in prof.blocked_cuts)
    legal = prof.legal_starts()
    c = free_cluster(3)
    plans = [partition(prof, c, "gpipe", stages=3, microbatches=2),
             partition(prof, c, "prefix-sum", stages=3), partition(prof, c, "pipedream", straight=True)]
    for plan in plans:
        assert all(legal[s.start] for s in plan.stages), plan.describe()
    # the same profile without its record: every partitioner picks a cut that training refuses
    free = dataclasses.replace(prof, blocked_cuts=())
    assert not all(legal[s.start] for s in partition(free, c, "gpipe", stages=3, microbatches=2).stages)

    def data():
        g = torch.Generator().manual_seed(1)
        while True:
            x = torch.randint(0, 23, (4, 8), generator=g)
            yield x, torch.roll(x, -1, dims=1)

    def loss_fn(out, y):
        return nn.functional.cross_entropy(out.reshape(-1, 23), y.reshape(-1))

    run = pl.train(TinyGPT, plans[0], method="gpipe", data=data, loss_fn=loss_fn, steps=1, microbatches=2,
                   optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), backend="local", progress=False)
    assert run.trace is not None
    # an illegal plan is refused before training, naming the layers
    bad = next(i for i in range(1, len(prof)) if not legal[i])
    with pytest.raises(ValueError, match=f"cannot start at layer {bad}"):
        Plan.from_boundaries(len(prof), [bad], profile=prof)
