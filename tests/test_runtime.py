"""The reference executor (one process) against oracles, and bad input caught before any process starts.

Oracles: plain single-process minibatch training (synchronous methods must match it), and
PipeDream's semantics written independently as stale-weight SGD (weight stashing must match it).
"""

from __future__ import annotations

import socket

import pytest
import test_runtime_helpers as H
import torch

import pipelab as pl
from pipelab.graph import layer_nodes, trace

pytestmark = pytest.mark.timeout(120)

MLP_L, CNN_L, PAIR_L = 5, 8, 14


def _train(model_fn, data, plan, method, *, steps=5, microbatches=4, opt=H.sgd, **kw):
    return pl.train(model_fn, plan, method=method, data=data, loss_fn=H.loss_fn, optimizer=opt, steps=steps,
                    microbatches=microbatches, backend="local", progress=False, **kw)


def test_layer_counts_of_the_test_models():
    assert [len(layer_nodes(trace(f()))) for f in (H.mlp, H.cnn, H.pair)] == [MLP_L, CNN_L, PAIR_L]


SYNC_CASES = [
    ("gpipe", H.mlp, H.mlp_data, MLP_L, [2, 4], [1, 1, 1], 4, {}),
    ("gpipe", H.cnn, H.cnn_data, CNN_L, [3], [2, 1], 4, {}),
    ("1f1b-flush", H.mlp, H.mlp_data, MLP_L, [1, 2, 3], [1, 1, 1, 1], 4, {}),
    ("1f1b-flush", H.cnn, H.cnn_data, CNN_L, [2, 5], [1, 1, 1], 2, {}),   # the skip value crosses both cuts
    ("interleaved-1f1b", H.cnn, H.cnn_data, CNN_L, [2, 4, 6], [1, 1, 1, 1], 4, {"chunks": 2}),
    ("zb-h1", H.mlp, H.mlp_data, MLP_L, [2, 3], [1, 1, 1], 4, {}),
    ("zb-h1", H.cnn, H.cnn_data, CNN_L, [4], [1, 2], 4, {}),
    ("dp", H.cnn, H.cnn_data, CNN_L, [], [4], 4, {}),
    ("dp", H.mlp, H.mlp_data, MLP_L, [2], [1, 1], 2, {}),       # dp ignores a pipeline plan's cuts
    ("1f1b-flush", H.pair, H.pair_data, PAIR_L, [4, 9], [1, 2, 1], 4, {}),
]


@pytest.mark.parametrize("method,model_fn,data,L,cuts,reps,M,opts", SYNC_CASES,
                         ids=[f"{c[0]}-{c[1].__name__}-{len(c[5])}st" for c in SYNC_CASES])
def test_reference_executor_sync_methods_equal_plain_training(method, model_fn, data, L, cuts, reps, M, opts):
    plan = pl.Plan.from_boundaries(L, cuts, reps)
    res = _train(model_fn, data, plan, method, microbatches=M, **opts)
    if model_fn is H.pair:
        ref = H.reference_pair(H.sgd, 5)
    else:
        ref = H.reference_training(model_fn, data, H.sgd, 5)
    assert H.max_diff(res.state_dict(), ref) < 1e-5
    assert res.trace.actions_by_worker() == {
        w: [str(a) for a in acts] for w, acts in enumerate(res.schedule.actions)
    }
    assert all(n == 1 for n in res.versions_held.values())
    assert len(res.losses) == 5 and all(x > 0 for x in res.losses)


def test_adam_and_microbatch_counts_do_not_change_the_result():
    plan = pl.Plan.from_boundaries(MLP_L, [2])
    ref = H.reference_training(H.mlp, H.mlp_data, H.adam, 4)
    for M in (1, 2, 8):
        res = _train(H.mlp, H.mlp_data, plan, "1f1b-flush", steps=4, microbatches=M, opt=H.adam)
        assert H.max_diff(res.state_dict(), ref) < 1e-5, M


def test_losses_are_the_plain_models_minibatch_losses():
    plan = pl.Plan.from_boundaries(MLP_L, [3])
    res = _train(H.mlp, H.mlp_data, plan, "gpipe", steps=3, microbatches=4, opt=H.sgd)
    torch.manual_seed(0)
    model = H.mlp()
    opt = H.sgd(model.parameters())
    expect = []
    for (x, y), _ in zip(H.mlp_data(), range(3)):
        opt.zero_grad()
        loss = H.loss_fn(model(x), y)
        expect.append(loss.item())
        loss.backward()
        opt.step()
    assert res.losses == pytest.approx(expect, abs=1e-5)


@pytest.mark.parametrize("cuts,reps", [([2, 3], [1, 1, 1]), ([3], [2, 1]), ([1, 2, 4], [1, 1, 1, 1])])
def test_pipedream_equals_stale_weight_sgd_and_stashes_versions(cuts, reps):
    plan = pl.Plan.from_boundaries(MLP_L, cuts, reps)
    K = 8
    res = _train(H.mlp, H.mlp_data, plan, "pipedream", steps=K, microbatches=1)
    sched = res.schedule
    fv = H.f_versions(sched)
    if all(r == 1 for r in reps):
        oracle = H.stale_weight_oracle(H.mlp, H.mlp_data, H.sgd, plan, [[fv[s][k] for k in range(K)]
                                                                       for s in range(plan.num_stages)], K)
        assert H.max_diff(res.state_dict(), oracle) < 1e-5
    # every backward (and the trace as a whole) uses the version its forward used
    f_of = {(e.stage, e.microbatch): e.weight_version for e in res.trace.compute_events() if e.kind == "F"}
    for e in res.trace.compute_events():
        if e.kind == "B":
            assert e.weight_version == f_of[(e.stage, e.microbatch)], e
        if e.kind in "FBW":
            assert e.weight_version == sched.version_of(e.worker, e.step)
    assert res.versions_held == {s: sched.versions_held(s) for s in range(sched.num_stages)}
    if all(r == 1 for r in reps):   # closed form: P - s versions at stage s (SOSP'19 §3.3)
        P = plan.num_stages
        assert res.versions_held == {s: P - s for s in range(P)}
    # n versions cost exactly n copies of the stage's weights (copy-on-write stash, measured storages)
    sd = H.mlp().state_dict()
    for s, names in enumerate(H.stage_param_names(H.mlp, plan)):
        nbytes = sum(sd[n].numel() * sd[n].element_size() for n in names)
        assert res.weight_bytes[s] == res.versions_held[s] * nbytes, (s, res.weight_bytes)


def test_vertical_sync_uses_the_input_stages_version_everywhere():
    plan = pl.Plan.from_boundaries(MLP_L, [1, 2, 4])
    K = 10
    res = _train(H.mlp, H.mlp_data, plan, "pipedream", steps=K, microbatches=1, vertical_sync=True)
    evs = res.trace.compute_events()
    v0 = {e.microbatch: e.weight_version for e in evs if e.kind == "F" and e.stage == 0}
    assert len(set(v0.values())) > 2          # the versions really move
    for e in evs:
        if e.kind in "FB":
            assert e.weight_version == v0[e.microbatch], e
            assert e.weight_version == res.schedule.version_of(e.worker, e.step)
    oracle = H.stale_weight_oracle(H.mlp, H.mlp_data, H.sgd, plan, [[v0[k] for k in range(K)]] * 4, K)
    assert H.max_diff(res.state_dict(), oracle) < 1e-5
    # a vertically synced stage keeps the versions its upcoming forwards will ask for: NOAM = P of them
    # at every stage (closed form), and the schedule counts the same
    assert res.versions_held == {s: 4 for s in range(4)}
    assert res.versions_held == {s: res.schedule.versions_held(s) for s in range(4)}


def test_naive_async_reads_the_newest_weights_and_keeps_one_version():
    plan = pl.Plan.from_boundaries(MLP_L, [2, 4])
    res = _train(H.mlp, H.mlp_data, plan, "naive-async", steps=6, microbatches=1)
    for e in res.trace.compute_events():
        if e.kind in "FB":
            assert e.weight_version == res.schedule.version_of(e.worker, e.step)
    stale = [e for e in res.trace.compute_events() if e.kind == "B" and e.stage == 0 and e.microbatch > 0]
    f_of = {(e.stage, e.microbatch): e.weight_version for e in res.trace.compute_events() if e.kind == "F"}
    assert any(e.weight_version != f_of[(0, e.microbatch)] for e in stale)   # B really reads newer weights
    assert res.versions_held == {0: 1, 1: 1, 2: 1}     # closed form: no stash, one version
    assert res.versions_held == {s: res.schedule.versions_held(s) for s in range(3)}
    stash = _train(H.mlp, H.mlp_data, plan, "pipedream", steps=6, microbatches=1)
    assert H.max_diff(res.state_dict(), stash.state_dict()) > 1e-6    # the ablation differs from stashing


def test_trace_jsonl_is_written_and_loads_back(tmp_path):
    plan = pl.Plan.from_boundaries(MLP_L, [2])
    res = _train(
        H.mlp, H.mlp_data, plan, "1f1b-flush", steps=2, microbatches=2, trace_path=tmp_path / "t.jsonl"
    )
    back = pl.Trace.load_jsonl(tmp_path / "t.jsonl")
    assert back.events == res.trace.events
    assert back.meta["method"] == "1f1b-flush"


def test_custom_schedule_is_executed_as_given():
    plan = pl.Plan.from_boundaries(MLP_L, [2])
    sched = pl.schedules.build("gpipe", plan, microbatches=2, minibatches=3)
    res = pl.train(H.mlp, plan, schedule=sched, data=H.mlp_data, loss_fn=H.loss_fn, optimizer=H.sgd, steps=3,
                   backend="local", progress=False)
    assert res.schedule is sched
    assert H.max_diff(res.state_dict(), H.reference_training(H.mlp, H.mlp_data, H.sgd, 3)) < 1e-5


# ---------------------------------------------------------------------------------- bad input
def _check(match, **kw):
    args = dict(plan=pl.Plan.from_boundaries(MLP_L, [2]), method="1f1b-flush", data=H.mlp_data,
                loss_fn=H.loss_fn, optimizer=H.sgd, steps=2, microbatches=2, backend="gloo", progress=False)
    args.update(kw)
    model_fn = args.pop("model_fn", H.mlp)
    with pytest.raises((ValueError, TypeError), match=match):
        pl.train(model_fn, **args)


def test_plan_for_another_model_is_refused():
    _check(r"plan is for a model of 8 layers but this model has 5; partition this model's profile",
           plan=pl.Plan.from_boundaries(8, [4]))


def test_data_with_wrong_shapes_is_refused_in_the_parent():
    _check(r"fails on the first microbatch of data\(\)", data=H.bad_shape_data)


def test_batch_not_divisible_by_microbatches_is_refused():
    _check(r"a minibatch of 8 samples does not split into microbatches=3", microbatches=3, method="gpipe")


def test_nccl_without_gpus_is_refused():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    _check(r"backend='nccl' needs one CUDA GPU per worker", backend="nccl")


def test_busy_port_is_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        _check(rf"port {port} on 127.0.0.1 is in use", port=port)


def test_lambda_model_fn_is_refused_for_processes():
    _check(r"model_fn cannot be sent to worker processes", model_fn=lambda: H.mlp())


def test_unknown_backend_and_method_are_refused():
    _check(r"backend='mpi'", backend="mpi")
    _check(r"unknown method", method="nope")


def test_later_minibatch_with_wrong_shape_names_it():
    plan = pl.Plan.from_boundaries(MLP_L, [2])
    with pytest.raises(ValueError, match=r"minibatch 1 of data\(\) has shapes"):
        _train(H.mlp, H.later_bad_data, plan, "1f1b-flush", steps=2, microbatches=2)


def test_reference_executor_reports_a_deadlocking_schedule():
    from pipelab.schedules.actions import Action, Schedule

    plan = pl.Plan.from_boundaries(MLP_L, [2])
    acts = ((Action(0, "B", 0), Action(0, "F", 0), Action(0, "U", 0)),     # B before its own F: waits forever
            (Action(1, "F", 0), Action(1, "B", 0), Action(1, "U", 0)))
    bad = Schedule(method="1f1b-flush", num_stages=2, stage_ranks=((0,), (1,)), microbatches=1, minibatches=1,
                   actions=acts)
    with pytest.raises(
        RuntimeError, match=r"deadlocks.*worker 0 at step 0 \(0B0\).*worker 1 at step 0 \(1F0\)"
    ):
        pl.train(H.mlp, plan, schedule=bad, data=H.mlp_data, loss_fn=H.loss_fn, optimizer=H.sgd, steps=1,
                 backend="local", progress=False)


@pytest.mark.parametrize("method,L,cuts,reps,M,opts", [
    ("1f1b-flush", MLP_L, [1, 2, 3], [1, 1, 1, 1], 4, {}),
    ("gpipe", MLP_L, [2], [1, 2], 4, {}),
    ("pipedream", MLP_L, [2, 3], [2, 1, 1], 1, {}),
    ("interleaved-1f1b", CNN_L, [2, 4, 6], [1, 1, 1, 1], 4, {"chunks": 2}),
    ("zb-h1", MLP_L, [2, 3], [1, 1, 1], 4, {}),
])
def test_sends_are_retired_only_once_causally_received(method, L, cuts, reps, M, opts):
    """A worker waits on a gloo send (which blocks until the peer posts the receive) only after it
    received a message the peer produced at or after the action consuming that send; and a send
    is left to the final flush only when its peer never answers after consuming it."""
    from pipelab.runtime.comm import ACT, GRAD, tag
    from pipelab.runtime.job import TrainArgs, prepare
    from pipelab.runtime.worker import Worker
    from pipelab.schedules.actions import Action

    model_fn, data = (H.cnn, H.cnn_data) if L == CNN_L else (H.mlp, H.mlp_data)
    job = prepare(TrainArgs.of(
        model_fn=model_fn,
        plan=pl.Plan.from_boundaries(L, cuts, reps),
        method=method,
        data=data,
        loss_fn=H.loss_fn,
        optimizer=H.sgd,
        steps=4,
        microbatches=M,
        **opts,
    ))
    sched = job.schedule
    workers = [Worker(job, r) for r in range(sched.num_workers)]
    nb = workers[0].nb
    where = {(w, a): i for w, acts in enumerate(sched.actions) for i, a in enumerate(acts)}

    def consumer(dst: int, key: int) -> int:  # index in dst's list of the action that receives key
        return next(
            j for j in range(len(sched.actions[dst])) if any(r.tag == key for r in workers[dst].recvs(j))
        )

    def producers(w: int, i: int, src: int) -> list[int]:   # src's indices of the messages w gets at action i
        a = sched.actions[w][i]
        made_by = (
            Action(a.stage - 1, "F", a.microbatch)
            if a.kind == "F"
            else Action(a.stage + 1, "B", a.microbatch)
        )
        return [where[(src, made_by)] for r in workers[w].recvs(i) if r.src == src]

    for w, wk in enumerate(workers):
        sent_at = {}
        for i, a in enumerate(sched.actions[w]):
            s, m = a.stage, a.microbatch
            if a.kind == "F" and s < sched.num_stages - 1 and sched.worker_of(s + 1, m) != w:
                sent_at[(sched.worker_of(s + 1, m), tag(ACT, s, m, nb))] = i
            if a.kind == "B" and s > 0 and sched.worker_of(s - 1, m) != w:
                sent_at[(sched.worker_of(s - 1, m), tag(GRAD, s - 1, m, nb))] = i
        retired: set[tuple[int, int]] = set()
        for i in range(len(sched.actions[w])):
            for dst, key in wk.retire_after(i):
                assert sent_at[(dst, key)] < i and (dst, key) not in retired, (w, i, dst, key)
                retired.add((dst, key))
                assert consumer(dst, key) <= max(producers(w, i, dst)), (w, i, dst, key)
        assert retired, "nothing is ever retired"
        for (dst, key), i in sent_at.items():
            if (dst, key) not in retired:
                j = consumer(dst, key)
                assert all(k < j for i2 in range(i + 1, len(sched.actions[w])) for k in producers(w, i2, dst))
