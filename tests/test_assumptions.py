"""Every number says what it assumes: one microbatch default and divisibility check, a cluster spec
string wherever a cluster goes, warnings for a CPU profile on GPUs and for a layer too big to split,
and records whose repr is a few lines."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from torch import nn

import pipelab as pl
from pipelab.batching import check_divides, default_microbatches
from pipelab.costs import CostModel
from pipelab.costs import devices as device_check
from pipelab.models import demo
from pipelab.partition.hetero import virtual_workers
from pipelab.planner.search import _microbatch_counts


@pytest.fixture(scope="module")
def prof() -> pl.Profile:
    return pl.profile(demo.mlp(), torch.randn(8, 64), progress=False, repeats=1, small_batch=None)


def test_one_default_and_one_check_for_microbatches(prof: pl.Profile) -> None:
    plan = pl.partition(prof, "flat:4", "gpipe")
    assert plan.notes["microbatches"] == default_microbatches(plan.num_stages) == plan.num_stages
    sched = pl.schedules.build("1f1b-flush", plan)
    assert sched.microbatches == plan.num_stages                  # build's default is the same one
    with pytest.raises(ValueError) as expected:
        check_divides(8, 3)
    for call in (lambda: pl.partition(prof, "flat:4", "gpipe", microbatches=3),
                 lambda: pl.simulate(plan, prof, "flat:4", "gpipe", microbatches=3)):
        with pytest.raises(ValueError) as got:
            call()
        assert str(got.value) == str(expected.value)
    data = functools.partial(demo.batches, (torch.randn(16, 64), torch.randint(0, 10, (16,))), 8)
    with pytest.raises(ValueError) as got:
        pl.train(demo.mlp, plan, method="gpipe", data=data, loss_fn=nn.functional.cross_entropy,
                 optimizer=functools.partial(torch.optim.SGD, lr=0.1), steps=1, microbatches=3,
                 backend="local", progress=False)
    assert str(got.value) == str(expected.value)
    assert all(8 % m == 0 for m in _microbatch_counts(4, 8, None) + _microbatch_counts(3, 8, [3, 6, 12]))


def test_times_name_microbatches_replica_batch_and_flush(prof: pl.Profile) -> None:
    gp = pl.partition(prof, "flat:2", "gpipe")
    assert "M=2 microbatches of 4 samples, fill and drain (the flush) included" in gp.describe()
    dp = pl.partition(prof, "flat:2", "dp")
    assert "each of 2 replicas takes whole minibatches of 8 samples, M=1" in dp.describe()
    assert dp.describe().splitlines()[0].startswith("Plan one stage on 2 replicas (dp)")
    sim = pl.simulate(gp, prof, "flat:2", "1f1b-flush")
    assert "M=2 microbatches of 4 samples" in repr(sim) and "flush) included" in repr(sim)
    asy = pl.simulate(gp, prof, "flat:2", "pipedream")
    assert "fill and drain left out" in asy.describe()


def test_every_function_taking_a_cluster_takes_a_spec(prof: pl.Profile) -> None:
    plan = pl.partition(prof, "flat:2", "gpipe")
    assert pl.simulate(plan, prof, "flat:2", "gpipe").throughput == pl.simulate(
        plan, prof, pl.Cluster.flat(2), "gpipe").throughput
    assert CostModel(prof, "flat:2").cluster == pl.Cluster.flat(2)
    assert virtual_workers("hetpipe:2x2") == virtual_workers(pl.Cluster.parse("hetpipe:2x2"))
    with pytest.raises(TypeError, match="spec string"):
        pl.simulate(plan, prof, 2, "gpipe")


def test_a_cpu_profile_on_a_gpu_preset_warns_once_naming_the_factor(prof, monkeypatch) -> None:
    monkeypatch.setattr(device_check, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pl.simulate(2, prof, "dgx-h100:1x2", "gpipe")
        pl.partition(prof, "dgx-h100:1x2", "gpipe")
        pl.simulate(2, prof, "flat:2", "gpipe")                      # a generic device: the profiled one
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "speed factor 1" in said[0] and "Cluster.preset(name, speed=S)" in said[0]


def test_a_layer_holding_most_of_the_time_is_named() -> None:
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 2, 64, batch_first=True), 4)
    with pytest.warns(UserWarning, match="TransformerEncoder.*ModuleList"):
        pl.profile(nn.Sequential(nn.Embedding(100, 32), enc, nn.Linear(32, 100)),
                   torch.randint(0, 100, (8, 12)), progress=False, repeats=1, small_batch=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # one big Linear has no children to expose: no warning
        pl.profile(nn.Sequential(nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 2)), torch.randn(8, 64),
                   progress=False, repeats=1, small_batch=None)


def test_records_repr_is_short_and_html(prof: pl.Profile) -> None:
    plan = pl.partition(prof, "flat:2", "gpipe")
    sim = pl.simulate(plan, prof, "flat:2", "gpipe", minibatches=50)
    for record in (prof, plan, sim, sim.trace, sim.schedule, pl.Cluster.parse("pipedream-a:4x4")):
        text = repr(record)
        assert len(text) < 2000 and text.count("\n") <= 13, (type(record).__name__, len(text))
        assert record._repr_html_().startswith("<"), type(record).__name__
