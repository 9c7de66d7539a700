"""Shared (tied) parameters: detection by identity, records, refusal of asynchronous methods, and the
reference executor's exact training against plain SGD (the multi-process oracles: test_ties_mp.py)."""

from __future__ import annotations

import dataclasses

import pytest
import tie_helpers as H
import torch
from torch import nn

import pipelab as pl
from pipelab.graph import layer_nodes, trace
from pipelab.runtime.ties import TieError
from pipelab.ties import Tie, find_ties, stage_ties

SYNC = [("gpipe", {}), ("1f1b-flush", {}), ("interleaved-1f1b", {"chunks": 2}), ("zb-h1", {})]
ASYNC = ["pipedream", "pipemare", "naive-async", "hetpipe"]    # each stage its own versions: refused


@pytest.fixture(scope="module")
def profile() -> pl.Profile:
    """The tied GPT's profile (one measurement, shared by the tests of this module)."""
    x, _ = H.data()[0]
    return pl.profile(H.tied_gpt(), x, warmup=0, repeats=1, progress=False)


def _plan(stages: int, *, chunks: int = 1) -> pl.Plan:
    ends = H.block_ends()
    n = len(layer_nodes(trace(H.tied_gpt())))
    cuts = {1: [], 2: [ends[2]], 3: [ends[1], ends[3]], 4: [ends[0], ends[2], ends[3]],
            6: ends}[stages * chunks]
    return pl.Plan.from_boundaries(n, cuts)


def test_find_ties_by_identity_not_name() -> None:
    gm = trace(H.tied_gpt())
    n = len(layer_nodes(gm))
    (t,) = find_ties(gm)
    assert t.names == ("head.weight", "wte.weight") and t.layers == (3, n - 1)
    assert t.nbytes == 97 * 32 * 4 and t.shape == (97, 32)
    assert find_ties(trace(H.untied_gpt())) == ()

    class Twice(nn.Module):   # one module called twice: all its weights shared by two layers
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(torch.relu(self.lin(x)))

    ties = find_ties(trace(Twice()))
    assert [(x.names, x.layers) for x in ties] == [(("lin.bias",), (0, 2)), (("lin.weight",), (0, 2))]


def test_stage_ties_on_the_stage_modules() -> None:
    gm = trace(H.tied_gpt())
    n = len(layer_nodes(gm))
    ends = H.block_ends()
    (t,) = stage_ties(gm, [(0, ends[1]), (ends[1], ends[3]), (ends[3], n)])
    # each stage's module holds the matrix under its own name; found by identity all the same
    assert t.stages == (0, 2) and t.name_on(0).endswith("wte.weight") and t.name_on(2).endswith("head.weight")
    assert t.name == "head.weight=wte.weight"
    assert stage_ties(gm, [(0, n)]) == ()          # one stage: nothing shared across stages


def test_profile_and_plan_record_the_tie(profile: pl.Profile) -> None:
    prof = profile
    (t,) = prof.ties
    assert t.names == ("head.weight", "wte.weight")
    assert pl.Profile.from_dict(prof.to_dict()) == prof
    made = pl.partition(prof, "pipedream-a:3", "gpipe", stages=3)
    assert made.ties == prof.ties and {st for _, sts in made.shared() for st in sts} >= {0, 2}
    plan = _plan(3).with_predictions(ties=prof.ties)
    ((tie, stages),) = plan.shared()
    assert tie == t and stages == (0, 2)
    assert pl.Plan.from_dict(plan.to_dict()).ties == plan.ties
    text = plan.describe()
    assert "shared: parameter head.weight=wte.weight (97x32, 12,416 bytes)" in text
    assert "stages [0, 2]" in text
    assert plan.with_predictions(stages=_plan(1).stages).shared() == ()
    with pytest.raises(ValueError, match="tie"):
        Tie(names=("a",), layers=(1,), nbytes=4)


@pytest.mark.parametrize("method", ASYNC)
def test_asynchronous_methods_refused_before_any_process(method: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    launch_mod = importlib.import_module("pipelab.runtime.launch")

    def no_process(self):  # type: ignore[no-untyped-def]
        raise AssertionError("a process was started")

    monkeypatch.setattr(launch_mod.Run, "_start_processes", no_process)
    # hetpipe: two virtual workers (each a two-stage pipeline), whole waves of minibatches
    plan = _plan(2) if method != "hetpipe" else pl.Plan.from_boundaries(_plan(2).num_layers,
                                                                        [_plan(2).stages[1].start], [2, 2])
    steps = 4 if method == "hetpipe" else 2
    with pytest.raises(TieError) as err:
        pl.train(H.tied_gpt, plan, method=method, data=H.data, loss_fn=H.loss_fn, optimizer=H.sgd,
                 steps=steps, backend="gloo", progress=False)
    msg = str(err.value)
    assert "head.weight=wte.weight" in msg and "stages [0, 1]" in msg and "asynchronous" in msg
    assert "update after every microbatch" in msg
    assert "Untie it" in msg and "1f1b-flush" in msg and "one stage" in msg
    # untied, or both users on one stage: accepted (the local executor runs it)
    pl.train(H.untied_gpt, plan, method=method, data=H.data, loss_fn=H.loss_fn, optimizer=H.sgd,
             steps=steps, backend="local", progress=False)


@pytest.mark.parametrize("method,options", SYNC)
def test_reference_executor_equals_plain_sgd_and_copies_stay_equal(method: str, options: dict) -> None:
    for steps in range(1, H.STEPS + 1):      # after every step
        res = pl.train(H.tied_gpt, _plan(3 if method != "interleaved-1f1b" else 2, **options), method=method,
                       data=H.data, loss_fn=H.loss_fn, optimizer=H.sgd, steps=steps, microbatches=2,
                       backend="local", progress=False, **options)
        st = res.state_dict()
        assert torch.equal(st["wte.weight"], st["head.weight"])
        assert H.distance(st, H.plain(steps=steps)) < 1e-6


def test_untied_gpt_is_the_control() -> None:
    # the same run on an untied copy differs from the tied plain model: the oracle can fail
    res = pl.train(H.untied_gpt, _plan(2), method="gpipe", data=H.data, loss_fn=H.loss_fn, optimizer=H.sgd,
                   steps=H.STEPS, microbatches=2, backend="local", progress=False)
    assert H.distance(res.state_dict(), H.plain(H.untied_gpt)) < 1e-6
    assert H.distance(res.state_dict(), H.plain()) > 1e-3



@pytest.mark.filterwarnings("ignore:the profile of GPT was measured on cpu")
def test_simulator_prices_the_tie_in_u_and_counts_every_copy(profile: pl.Profile) -> None:
    prof = profile
    untied = dataclasses.replace(prof, ties=())       # the same costs, the tie forgotten
    (t,) = prof.ties
    n, plan, cluster = len(prof), _plan(2), pl.Cluster.of("pipedream-a:2")
    cm, cm_untied = pl.costs.CostModel(prof, cluster), pl.costs.CostModel(untied, cluster)
    cut = plan.stages[1].start
    # the head's stage holds its own copy of the matrix that the profile counted on the embedding's layer
    assert cm.param_bytes(cut, n) - cm_untied.param_bytes(cut, n) == t.nbytes
    assert cm.param_bytes(0, n) == cm_untied.param_bytes(0, n)        # one stage: one copy
    tied_run = pl.simulate(plan, prof, cluster, "1f1b-flush", microbatches=2, minibatches=2)
    plain_run = pl.simulate(plan, untied, cluster, "1f1b-flush", microbatches=2, minibatches=2)

    def u_s(res: pl.SimResult, stage: int) -> float:
        return sum(e.end_s - e.start_s for e in res.trace.events if e.kind == "U" and e.stage == stage)

    allreduce = cm.allreduce_s(t.nbytes, [0, 1])     # the two stages' workers, over the cluster's link
    assert allreduce > 0
    # stage 0's U gains the all-reduce; stage 1's also the optimizer step over its copy
    assert u_s(tied_run, 0) - u_s(plain_run, 0) == pytest.approx(2 * allreduce, rel=1e-9)
    assert u_s(tied_run, 1) - u_s(plain_run, 1) > 2 * allreduce
    assert tied_run.peak_memory[1] > plain_run.peak_memory[1]
    assert tied_run.peak_memory[0] == plain_run.peak_memory[0]


def test_partition_graph_draws_the_tie() -> None:
    from pipelab.views.partition_graph import partition_graph

    prof = pl.Profile.synthetic([1.0] * 6, model="toy")
    tie = Tie(names=("head.weight", "emb.weight"), layers=(0, 5), nbytes=64)
    prof = dataclasses.replace(prof, ties=(tie,))
    fig = partition_graph(prof, pl.Plan.from_boundaries(6, [3]))
    (curve,) = [tr for tr in fig.data if tr.name.startswith("shared")]
    assert curve.name == ("shared emb.weight=head.weight (a copy on each of stages [0, 1], gradients "
                          "summed at U)")
    assert fig.layout.meta["ties"] == [{"name": "emb.weight=head.weight", "layers": [0, 5], "stages": [0, 1]}]
    one = partition_graph(prof, pl.Plan.from_boundaries(6, []))
    assert [tr.name for tr in one.data if tr.name.startswith("shared")] == [
        "shared emb.weight=head.weight (on stage 0 only)"]


def test_torch_bridge_refuses_a_tie_across_stages() -> None:
    from pipelab.schedules import build
    from pipelab.schedules.steps import ScheduleError
    from pipelab.torch_bridge.export import stage_modules

    plan = _plan(2)
    sched = build("1f1b-flush", plan, microbatches=2, minibatches=1)
    with pytest.raises(ScheduleError, match=r"head.weight=wte.weight \(97x32\) is shared by stages \[0, 1\]"):
        stage_modules(plan, sched, H.tied_gpt(), rank=0)
    assert set(stage_modules(plan, sched, H.untied_gpt(), rank=1)) == {1}


@pytest.mark.filterwarnings("ignore:the profile of GPT was measured on cpu")
@pytest.mark.parametrize("stages", [2, 3])
def test_partitioner_picked_plans_train_exactly(stages: int) -> None:
    """Whatever boundaries the partitioner picks (blocks as leaves, so no shape integer crosses a cut)."""
    from pipelab.models.gpt import Block
    from pipelab.runtime.job import TrainArgs, prepare
    from pipelab.runtime.launch import Run

    leaf = {"leaf_modules": [Block]}
    x, _ = H.data()[0]
    prof = pl.profile(H.tied_gpt(), x, warmup=0, repeats=1, progress=False, **leaf)
    plan = pl.partition(prof, f"pipedream-a:{stages}", "gpipe", stages=stages)
    assert plan.shared() and plan.shared()[0][1] == (0, stages - 1)
    want = H.plain()
    for method in ("gpipe", "1f1b-flush", "zb-h1"):
        job = prepare(TrainArgs(H.tied_gpt, plan, H.data, H.loss_fn, H.sgd, H.STEPS, method=method,
                                microbatches=2, backend="local", trace_kwargs=leaf))
        st = Run(job).wait().state_dict()
        assert torch.equal(st["wte.weight"], st["head.weight"])
        assert H.distance(st, want) < 1e-6



def test_planner_offers_no_asynchronous_method_for_a_tie_across_stages() -> None:
    prof = pl.Profile.synthetic([1.0] * 8, model="toy")
    tie = Tie(names=("emb.weight", "head.weight"), layers=(0, 7), nbytes=64)
    kw = dict(methods=["1f1b-flush", "pipedream", "2bw"], progress=False, margin=0.2)
    untied = pl.plan(prof, "pipedream-a:2", **kw).table
    table = pl.plan(dataclasses.replace(prof, ties=(tie,)), "pipedream-a:2", **kw).table
    # untied, the search has multi-stage pipedream rows; tied, pipedream remains only where one stage holds
    # every user of the tie, while 2bw (one version per minibatch) and the synchronous rows are all kept
    def rows(t, method):  # type: ignore[no-untyped-def]
        return t[t["method"] == method]

    assert (rows(untied, "pipedream")["stages"] > 1).any()
    assert (rows(table, "pipedream")["stages"] == 1).all()
    for method in ("2bw", "1f1b-flush"):
        assert len(rows(table, method)) == len(rows(untied, method)) > 0


@pytest.mark.parametrize("options", [{"coalesce_wgrad": True}, {"recompute": True}])
def test_runtime_options_keep_the_tie_exact(options: dict) -> None:
    """Deferred weight gradients are flushed before the tie's sum; recomputation changes nothing."""
    res = pl.train(H.tied_gpt, _plan(2), method="1f1b-flush", data=H.data, loss_fn=H.loss_fn,
                   optimizer=H.sgd, steps=H.STEPS, microbatches=2, backend="local", progress=False, **options)
    st = res.state_dict()
    assert torch.equal(st["wte.weight"], st["head.weight"]) and H.distance(st, H.plain()) < 1e-6


@pytest.mark.parametrize("method,options,delay", [("2bw", {}, 1), ("buffered", {"versions": 3}, 2)])
def test_one_version_per_minibatch_methods_keep_the_tie(method: str, options: dict, delay: int) -> None:
    """2BW and the bounded buffer read ``W(t - delay)`` on every stage: the tie is one weight, the run
    equals delayed SGD on the whole tied model (and not plain SGD)."""
    for stages in (2, 3):
        res = pl.train(H.tied_gpt, _plan(stages), method=method, data=H.data, loss_fn=H.loss_fn,
                       optimizer=H.sgd, steps=4, microbatches=2, backend="local", progress=False, **options)
        st = res.state_dict()
        assert torch.equal(st["wte.weight"], st["head.weight"])
        assert H.distance(st, H.delayed(steps=4, delay=delay)) < 1e-6
        assert H.distance(st, H.plain(steps=4)) > 1e-2
