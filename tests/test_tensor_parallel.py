"""Tensor × pipeline parallelism: a stage as a group of gloo processes, exact against plain training.

Oracles: plain single-process SGD of the whole GPT (tests/tp_models.py) for the synchronous methods;
for PipeDream the same schedule without tensor parallelism (its weight versions are the oracle's)."""

from __future__ import annotations

import dataclasses

import pytest
import test_runtime_helpers as H
import torch
import tp_models as T

import pipelab as pl

LAYERS = 46          # tp_models.GPT traced (pipelab.graph.layer_nodes)
CUT = 24             # after block 0's residual add
STEPS = 2


def plain_sgd(steps: int = STEPS, model_fn=T.gpt) -> dict[str, torch.Tensor]:
    """The oracle: the whole model trained on one process, minibatch SGD."""
    torch.manual_seed(0)
    model = model_fn()
    opt = T.sgd(model.parameters())
    it = iter(T.data())
    for _ in range(steps):
        x, y = next(it)
        opt.zero_grad()
        T.loss_fn(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def tensor_plan(boundaries: list[int], tensor: int, replicas: list[int] | None = None) -> pl.Plan:
    return pl.Plan.from_boundaries(LAYERS, boundaries, replicas, tensor=tensor)


def run(plan: pl.Plan, method: str, **kw) -> pl.runtime.RunResult:
    kw = {"microbatches": 2, "steps": STEPS, **kw}
    model_fn = kw.pop("model_fn", T.gpt)
    return pl.train(model_fn, plan, method=method, data=T.data, loss_fn=T.loss_fn, optimizer=T.sgd,
                    progress=False, timeout=120, **kw)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["gpipe", "1f1b-flush"])
def test_two_by_two_equals_plain_sgd(method: str) -> None:
    res = run(tensor_plan([CUT], 2), method)
    assert max_diff(res.state_dict(), plain_sgd()) < 1e-5
    assert res.trace.meta["tensor_groups"] == [[0, 2], [1, 3]]
    assert {e.worker for e in res.member_events} == {2, 3}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_by_one_equals_plain_sgd() -> None:
    res = run(tensor_plan([], 2), "gpipe")
    assert max_diff(res.state_dict(), plain_sgd()) < 1e-5
    assert res.trace.meta["tensor_groups"] == [[0, 1]] and {e.worker for e in res.trace.events} == {0}
    assert [e.kind for e in res.member_events if e.kind in "FBU"] == \
        [e.kind for e in res.trace.events if e.kind in "FBU"]     # the same action list, on both


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_replicated_tensor_groups_all_reduce_shard_by_shard() -> None:
    res = run(tensor_plan([], 2, [2]), "1f1b-flush")     # 2 replicas x tensor 2: 4 processes
    assert res.trace.meta["tensor_groups"] == [[0, 2], [1, 3]]
    assert max_diff(res.state_dict(), plain_sgd()) < 1e-5
    assert any(e.kind == "allreduce" for e in res.member_events)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_pipedream_with_tensor_parallelism_equals_it_without() -> None:
    plain = run(tensor_plan([CUT], 1), "pipedream")
    split = run(tensor_plan([CUT], 2), "pipedream")
    assert max_diff(split.state_dict(), plain.state_dict()) < 1e-5
    assert split.losses == pytest.approx(plain.losses, abs=1e-5)
    assert split.trace.actions_by_worker() == plain.trace.actions_by_worker()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_checkpoints_are_per_shard_and_bound_to_their_degree(tmp_path) -> None:
    ck = tmp_path / "ck"
    res = run(tensor_plan([], 2), "1f1b-flush", checkpoint_every=1, checkpoint_dir=str(ck))
    want = plain_sgd()
    assert max_diff(res.state_dict(), want) < 1e-5
    first = ck / "step-00000001"
    assert sorted(p.name for p in first.glob("rank-*.pt")) == ["rank-0.pt", "rank-1.pt"]   # one per shard
    resumed = run(tensor_plan([], 2), "1f1b-flush", resume=str(first))
    assert max_diff(resumed.state_dict(), want) < 1e-5
    with pytest.raises(ValueError, match=r"tensor degrees \[2\].*this run's plan has degrees \[1\]"):
        run(tensor_plan([], 1), "1f1b-flush", resume=str(first))


def test_a_degree_that_does_not_divide_is_refused_with_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"stage 0: tensor degree 3 does not divide .*valid degrees for "
                                         r"this model: \[1, 2\]"):
        run(tensor_plan([CUT], 3), "gpipe")


def test_more_processes_than_the_cores_allow_are_refused(monkeypatch) -> None:
    import os

    import pipelab.runtime.tensor_group as tg

    assert tg.usable_cores() == len(os.sched_getaffinity(0))
    monkeypatch.setattr(tg, "usable_cores", lambda: 1)
    with pytest.raises(ValueError, match=r"needs 4 worker processes but this machine has 1 usable core.*at "
                                         r"most max_per_core=2 .* \(2\)"):
        run(tensor_plan([CUT], 2), "gpipe", max_per_core=2)


def test_what_tensor_parallelism_does_not_run_with_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="backend='local'.*use backend='gloo'"):
        run(tensor_plan([], 2), "gpipe", backend="local")
    with pytest.raises(ValueError, match="parameter server"):
        run(tensor_plan([CUT], 2), "hetpipe", microbatches=None)
    with pytest.raises(ValueError, match="no tensor_parallel_plan"):
        plan = pl.Plan.from_boundaries(5, [])
        plan = dataclasses.replace(plan, stages=(dataclasses.replace(plan.stages[0], tensor=2),))
        pl.train(H.mlp, plan, method="gpipe", data=H.mlp_data, loss_fn=H.loss_fn, optimizer=H.sgd, steps=1)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["gpipe", "1f1b-flush"])
def test_tied_gpt_two_by_two_equals_plain_sgd(method: str) -> None:
    # the embedding (stage 0) and the head (stage 1) split over the vocabulary: shard k of each copy is
    # summed with shard k of the other (processes 0+1, 2+3), never with the other shard
    res = run(tensor_plan([CUT], 2), method, model_fn=T.tied_gpt)
    want = plain_sgd(model_fn=T.tied_gpt)
    assert torch.equal(want["wte.weight"], want["head.weight"])
    assert max_diff(res.state_dict(), want) < 1e-5
    ties = [e for e in res.member_events if e.kind == "allreduce"]
    assert {e.worker for e in ties} == {2, 3} and all(e.bytes == T.VOCAB // 2 * T.EMBD * 4 for e in ties)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_tied_gpt_two_by_one_keeps_one_shard_for_embedding_and_head() -> None:
    res = run(tensor_plan([], 2), "1f1b-flush", model_fn=T.tied_gpt)
    assert max_diff(res.state_dict(), plain_sgd(model_fn=T.tied_gpt)) < 1e-5


def test_a_shard_of_a_tied_weight_is_one_parameter_for_both_users() -> None:
    from pipelab.runtime.tensor_parallel import Group, shard

    model = T.tied_gpt()
    whole = model.wte.weight.detach().clone()
    dims = shard(model, T.GPT.tensor_parallel_plan, Group(1, 2, None))
    assert model.head.weight is model.wte.weight
    assert torch.equal(model.wte.weight, whole[T.VOCAB // 2:])
    assert dims["wte.weight"] == dims["head.weight"] == 0


def test_a_tie_cut_two_ways_or_across_two_degrees_is_refused_by_name() -> None:
    from pipelab.runtime.tensor_parallel import check_shared

    plan = {k: v for k, v in T.GPT.tensor_parallel_plan.items() if k != "head"}     # head kept whole
    with pytest.raises(ValueError, match=r"cuts differently: wte.weight \(split along dimension 0\), "
                                         r"head.weight \(whole\).*untie them"):
        check_shared(T.tied_gpt(), plan)
    mixed = tensor_plan([CUT], 2)
    second = dataclasses.replace(mixed.stages[1], tensor=1)
    mixed = dataclasses.replace(mixed, stages=(mixed.stages[0], second))
    with pytest.raises(ValueError, match=r"parameter head.weight=wte.weight is shared by stages of different "
                                         r"tensor degrees \(stage 0 tensor 2, stage 1 tensor 1\)"):
        run(mixed, "gpipe", model_fn=T.tied_gpt)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_group_that_loses_one_rank_ends_the_run_naming_rank_stage_and_shard() -> None:
    import os
    import signal
    import time

    import fault_helpers as F

    from pipelab.runtime import WorkerError

    run_ = pl.launch(T.gpt, tensor_plan([], 2), method="gpipe", data=T.data, loss_fn=T.loss_fn,
                     optimizer=T.sgd, steps=5000, microbatches=2, timeout=100)
    evs = iter(run_.events)
    for _ in range(6):          # the group is running actions
        next(evs)
    pids = run_.pids
    os.kill(pids[1], signal.SIGKILL)      # process 1: worker 0's shard 1
    t = time.time()
    with pytest.raises(WorkerError) as info:
        run_.wait()
    assert time.time() - t < 30
    msg = str(info.value)
    assert msg.startswith("process 1 (worker 0's tensor shard 1 of 2) (stage 0) died with exit code -9"), msg
    _, left = F.wait_gone(pids, within_s=10)
    assert not left


def test_the_gantt_draws_a_group_as_one_row_or_one_row_per_process() -> None:
    from pipelab.trace import Event, Trace
    from pipelab.views import gantt_groups

    assert pl.views.gantt_groups is gantt_groups and "gantt_groups" in pl.views.__all__

    lead = [Event(w, w, k, m, t + w, t + w + 0.5) for w in (0, 1) for m, (k, t) in enumerate((("F", 0.0),
                                                                                             ("B", 2.0)))]
    tr = Trace.from_events(lead, method="gpipe", stage_ranks=[[0], [1]], tensor_groups=[[0, 2], [1, 3]])
    members = [dataclasses.replace(e, worker=e.worker + 2) for e in lead]
    res = type("R", (), {"trace": tr, "member_events": members})()
    one = gantt_groups(res)
    assert list(one.layout.yaxis.ticktext) == ["w0 · stage 0 (replica 0) · tensor ranks 0, 2",
                                               "w1 · stage 1 (replica 0) · tensor ranks 1, 3"]
    every = gantt_groups(res, expand=True)
    assert list(every.layout.yaxis.ticktext) == [
        "w0 · stage 0 (replica 0) · tensor ranks 0, 2", "  rank 2 · w0's shard 1 of 2",
        "w1 · stage 1 (replica 0) · tensor ranks 1, 3", "  rank 3 · w1's shard 1 of 2"]
    assert every.layout.meta["boxes"] == 2 * one.layout.meta["boxes"] == 8
