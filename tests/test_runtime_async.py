"""Issue 6 on the runtime: 2BW / bounded buffer / PipeMare / HetPipe policies, compression, recomputation,
slowdowns and checkpoints - against oracles (hand computations, delayed-SGD and wave-BSP references,
the reference executor), on the single-process executor and real gloo processes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import test_runtime_async_helpers as H
import torch

from pipelab.partition.plan import Plan
from pipelab.runtime import param_server as wsp
from pipelab.runtime import policies, train
from pipelab.schedules import build
from pipelab.schedules.worker_view import stage_delays as schedule_delays

PLAN2 = Plan.from_boundaries(5, [2])          # fc1 | relu fc2 relu fc3
PLAN3 = Plan.from_boundaries(5, [1, 3])


def run(method: str, plan: Plan = PLAN2, backend: str = "local", steps: int = 6, microbatches: int = 2,
        opt: Any = H.momentum, model: Any = H.mlp, **kw: Any) -> Any:
    return train(model, plan, method=method, data=H.data, loss_fn=H.loss_fn, optimizer=opt, steps=steps,
                 microbatches=microbatches, backend=backend, progress=False, timeout=120, **kw)


def versions_agree(r: Any) -> None:
    """Every action's recorded weight version equals the schedule's."""
    s = r.schedule
    expect = {(w, i): v for w, vs in enumerate(s.versions) for i, v in enumerate(vs)}
    got = {(e.worker, e.step): e.weight_version for e in r.trace.compute_events()}
    assert got == expect


# ---------------------------------------------------------------------- 2BW rule by hand
def test_2bw_rule_by_hand() -> None:
    # f_t(w) = a_t * w**2 / 2, grad a_t * w; lr 0.5, a = (1, 2, 1), W(0) = 1.
    # W1 = 1 - .5*1*W0 = .5 ; W2 = W1 - .5*2*W0 = -.5 ; W3 = W2 - .5*1*W1 = -.75 (grad at W(t-1))
    a = [1.0, 2.0, 1.0]
    ws = policies.delayed_sgd(torch.tensor(1.0), lambda t, w: a[t] * w, 0.5, 3, delay=1)
    assert [float(w) for w in ws] == [1.0, 0.5, -0.5, -0.75]
    plain = policies.delayed_sgd(torch.tensor(1.0), lambda t, w: a[t] * w, 0.5, 3, delay=0)
    assert [float(w) for w in plain] == [1.0, 0.5, 0.0, 0.0]
    assert [policies.delayed_version(k, 1) for k in range(4)] == [0, 0, 1, 2]


def test_2bw_tiny_linear_model_by_hand() -> None:
    # One Linear(1, 1, bias=False) stage pair is overkill: the runtime on a 2-layer linear model
    # (w2 * (w1 * x)), loss (out - y)^2 / 2 per sample, must follow W(t+1) = W(t) - lr grad(W(t-1)).
    from test_runtime_async_helpers import Lin2, lin_data, mse

    r = train(Lin2, Plan.from_boundaries(2, [1]), method="2bw", data=lin_data, loss_fn=mse,
              optimizer=H.sgd, steps=3, microbatches=1, backend="local", progress=False)
    # hand computation with w1 = w2 = 0.5 at start, x = (1, 2, 1), y = (1, 1, 2), lr = 0.1
    xs, ys, lr = [1.0, 2.0, 1.0], [1.0, 1.0, 2.0], 0.1
    W = [(0.5, 0.5)]
    for t in range(3):
        w1, w2 = W[max(0, t - 1)]
        e = w2 * w1 * xs[t] - ys[t]
        g1, g2 = e * w2 * xs[t], e * w1 * xs[t]
        W.append((W[t][0] - lr * g1, W[t][1] - lr * g2))
    sd = r.state_dict()
    assert float(sd["l1.weight"]) == pytest.approx(W[3][0], abs=1e-6)
    assert float(sd["l2.weight"]) == pytest.approx(W[3][1], abs=1e-6)


# ---------------------------------------------------------------------- 2BW / buffered vs the delayed oracle
@pytest.mark.parametrize("method,kw,delay", [("2bw", {}, 1), ("buffered", {"versions": 3}, 2),
                                             ("buffered", {"versions": 4}, 3)])
def test_delayed_policies_match_oracle_and_memory_model(method: str, kw: dict, delay: int) -> None:
    r = run(method, PLAN3, microbatches=2, steps=7, **kw)
    ref = H.delayed_reference(H.mlp, H.data, H.momentum, 7, delay)
    assert H.max_diff(r.state_dict(), ref) < 1e-6
    versions_agree(r)
    K = delay + 1
    assert all(n <= K for n in r.versions_held.values())
    assert max(r.versions_held.values()) == K          # the bound is reached, not just respected
    assert r.versions_held == {s: r.schedule.versions_held(s) for s in r.versions_held}
    assert_weight_memory_matches_model(r, PLAN3)


def assert_weight_memory_matches_model(r: Any, plan: Plan) -> None:
    """Peak weight bytes measured per stage within 10% of the cost model's weights + stashed versions."""
    from pipelab.cluster import Cluster
    from pipelab.costs import CostModel
    from pipelab.profile.measure import profile

    torch.manual_seed(0)
    prof = profile(H.mlp(), next(iter(H.data()))[0], progress=False)
    cm = CostModel(prof, Cluster.flat(plan.num_workers))
    for st in plan.stages:
        mem = cm.memory_bytes(st.start, st.end, versions=r.versions_held[st.index], in_flight=1)
        model = mem["weights"] + mem["stashed_weights"]
        assert abs(r.weight_bytes[st.index] - model) <= 0.1 * model, (st.index, r.weight_bytes, model)


def test_pipedream_versions_p_minus_s_and_memory() -> None:
    plan = Plan.from_boundaries(5, [1, 2, 3])
    r = run("pipedream", plan, microbatches=1, steps=8)
    assert r.versions_held == {0: 4, 1: 3, 2: 2, 3: 1}
    assert_weight_memory_matches_model(r, plan)
    ref = run("pipedream", plan, microbatches=1, steps=8, recompute=True)   # stashed values are intact
    assert H.max_diff(ref.state_dict(), r.state_dict()) < 1e-6


# ---------------------------------------------------------------------- PipeMare
def test_pipemare_policy_in_runtime() -> None:
    plan = Plan.from_boundaries(5, [1, 3])
    r = run("pipemare", plan, microbatches=1, steps=8, warmup_steps=4, decay=0.5)
    versions_agree(r)
    assert schedule_delays(r.schedule) == {0: (2, 0), 1: (1, 0), 2: (0, 0)}
    # switches off: PipeMare is naive-async exactly
    off = run("pipemare", plan, microbatches=1, steps=8, lr_reschedule=False, discrepancy_correction=False)
    naive = run("naive-async", plan, microbatches=1, steps=8)
    assert H.max_diff(off.state_dict(), naive.state_dict()) == 0.0
    assert H.max_diff(r.state_dict(), naive.state_dict()) > 1e-4
    with pytest.raises(ValueError, match="belongs to method 'pipemare'"):
        run("naive-async", plan, microbatches=1, steps=2, warmup_steps=3)


def test_pipemare_lr_rescheduling_is_the_paper_factor() -> None:
    # T1 with the delays of the schedule being run: in a 3-stage pipeline that reaches steady state
    # stage 0's forward is tau = 2 updates old, so with K large its step is lr * 2**-(1 - 0) = lr / 2
    # at step 0; the last stage (tau = 0) keeps lr.
    plan = Plan.from_boundaries(5, [1, 3])
    sched = build("pipemare", plan, minibatches=3)
    factory = policies.policy_for("pipemare", {"schedule": sched, "warmup_steps": 1000,
                                               "discrepancy_correction": False})
    for stage, want in ((0, 0.5), (2, 1.0)):
        w = torch.nn.Parameter(torch.zeros(2))
        opt = torch.optim.SGD([w], lr=0.1)
        factory({"w": w}, stage).before_step(opt)
        assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * want)
    # a run too short to fill the pipeline has no delay in its schedule, so T1 changes nothing
    pm = run("pipemare", plan, microbatches=1, steps=1, opt=H.sgd, discrepancy_correction=False,
             warmup_steps=1000)
    naive = run("naive-async", plan, microbatches=1, steps=1, opt=H.sgd)
    assert H.max_diff(pm.state_dict(), naive.state_dict()) == 0.0


# ---------------------------------------------------------------------- HetPipe / WSP
HET1 = Plan.from_boundaries(5, [], replicas=[2])           # 2 virtual workers of one stage each
HET2 = Plan.from_boundaries(5, [2], replicas=[2, 2])       # 2 virtual workers of 2 stages


def wave_bsp_reference(V: int, steps: int, wave: int, opt_fn: Any) -> dict[str, torch.Tensor]:
    """D = 0 oracle for one-stage virtual workers: every wave each VW trains ``wave`` minibatches
    (round-robin: VW v gets minibatches v, v + V, ...) from the global weights with its own optimizer;
    the global weights then add every VW's change, in VW order."""
    torch.manual_seed(0)
    glob = H.mlp()
    models = [copy.deepcopy(glob) for _ in range(V)]
    opts = [opt_fn(m.parameters()) for m in models]
    batches = list(zip(range(steps), H.data()))
    local = [[b for i, b in batches if i % V == v] for v in range(V)]
    gstate = copy.deepcopy(glob.state_dict())
    for c in range(len(local[0]) // wave):
        ups = []
        for v in range(V):
            models[v].load_state_dict(gstate)
            for x, y in local[v][c * wave:(c + 1) * wave]:
                opts[v].zero_grad()
                H.loss_fn(models[v](x), y).backward()
                opts[v].step()
            ups.append({k: models[v].state_dict()[k] - gstate[k] for k in gstate})
        for u in ups:
            for k in gstate:
                gstate[k] = gstate[k] + u[k]
    return gstate


def test_hetpipe_d0_equals_wave_bsp_oracle() -> None:
    r = run("hetpipe", HET1, microbatches=1, steps=8, D=0, opt=H.sgd)
    ref = wave_bsp_reference(2, 8, 1, H.sgd)
    assert H.max_diff(r.state_dict(), ref) < 1e-6
    assert wsp.check_trace(r.trace, 0) == 0
    versions_agree(r)


# ---------------------------------------------------------------------- options
def test_recompute_equals_stored_activations_with_dropout() -> None:
    plan6 = Plan.from_boundaries(6, [1, 4])   # the dropout is a layer of its own
    a = run("1f1b-flush", plan6, microbatches=2, steps=3, model=H.drop_mlp)
    b = run("1f1b-flush", plan6, microbatches=2, steps=3, model=H.drop_mlp, recompute=True)
    assert H.max_diff(a.state_dict(), b.state_dict()) < 1e-6
    c = run("pipedream", PLAN3, microbatches=1, steps=6, recompute=True)
    d = run("pipedream", PLAN3, microbatches=1, steps=6)
    assert H.max_diff(c.state_dict(), d.state_dict()) < 1e-6


def _send_bytes(r: Any, stage: int, kind: str) -> int:
    return sum(e.bytes for e in r.trace.compute_events() if e.stage == stage and e.kind == kind)


def test_compression_bytes_and_error() -> None:
    base = run("gpipe", PLAN2, microbatches=2, steps=2)
    # forward activations of stage 0: 4 samples x 16 float32 per microbatch = 256 bytes
    n_msgs = 2 * 2
    assert _send_bytes(base, 0, "F") == n_msgs * 256
    half = run("gpipe", PLAN2, microbatches=2, steps=2, compression="fp16")
    q = run("gpipe", PLAN2, microbatches=2, steps=2, compression="int8")
    assert _send_bytes(half, 0, "F") == n_msgs * 128 and _send_bytes(half, 1, "B") == n_msgs * 128
    assert _send_bytes(q, 0, "F") == n_msgs * (64 + 4) and _send_bytes(q, 1, "B") == n_msgs * (64 + 4)
    # lossy but close: weights after two steps differ from the uncompressed run only a little
    assert 0 < H.max_diff(q.state_dict(), base.state_dict()) < 1e-2
    with pytest.raises(ValueError, match="unknown compression"):
        run("gpipe", PLAN2, steps=1, compression="zip")


def test_slowdown_checked_and_neutral() -> None:
    a = run("1f1b-flush", PLAN2, steps=2, slowdown={1: 1.5})
    b = run("1f1b-flush", PLAN2, steps=2)
    assert H.max_diff(a.state_dict(), b.state_dict()) == 0.0
    with pytest.raises(ValueError, match="factor >= 1"):
        run("1f1b-flush", PLAN2, steps=1, slowdown={1: 0.5})


def test_checkpoint_resume_exact_and_foreign_refused(tmp_path: Path) -> None:
    full = run("1f1b-flush", PLAN3, steps=6, checkpoint_every=2, checkpoint_dir=tmp_path / "ck")
    from pipelab.runtime import checkpoint_files as ck

    assert [p.name for p in ck.list_checkpoints(tmp_path / "ck")] == ["step-00000004", "step-00000006"]
    resumed = run("1f1b-flush", PLAN3, steps=6, resume=ck.step_dir(tmp_path / "ck", 4))
    assert H.max_diff(resumed.state_dict(), full.state_dict()) == 0.0
    assert len(resumed.losses) == 2
    with pytest.raises(ValueError, match="written for another plan"):
        run("1f1b-flush", PLAN2, steps=6, resume=tmp_path / "ck")
    with pytest.raises(ValueError, match="method '1f1b-flush'"):
        run("gpipe", PLAN3, steps=6, resume=tmp_path / "ck")
    with pytest.raises(ValueError, match="not before steps=6"):
        run("1f1b-flush", PLAN3, steps=6, resume=tmp_path / "ck")


# ---------------------------------------------------------------------- real processes == reference
@pytest.mark.slow
@pytest.mark.parametrize("method,plan,kw", [
    ("2bw", PLAN3, {"microbatches": 2, "compression": "int8"}),
    ("buffered", PLAN2, {"microbatches": 2, "versions": 3, "recompute": True}),
    ("pipemare", PLAN3, {"microbatches": 1, "warmup_steps": 4, "compression": "fp16"}),
    ("hetpipe", HET2, {"microbatches": 1, "D": 0}),
])
def test_multiprocess_equals_reference(method: str, plan: Plan, kw: dict) -> None:
    steps = 8
    g = run(method, plan, backend="gloo", steps=steps, **kw)
    loc = run(method, plan, backend="local", steps=steps, **kw)
    assert H.max_diff(g.state_dict(), loc.state_dict()) == 0.0
    versions_agree(g)
    assert g.versions_held == loc.versions_held
    if method == "hetpipe":
        assert wsp.check_trace(g.trace, 0) == 0


@pytest.mark.slow
def test_hetpipe_staleness_bound_under_slowdown() -> None:
    # VW 1 is 4x slower: VW 0 runs ahead until the bound D = 1 holds it back.
    r = run("hetpipe", HET1, backend="gloo", microbatches=1, steps=12, D=1, slowdown={1: 4.0})
    assert wsp.check_trace(r.trace, 1) <= 1
    pushes = [e for e in r.trace.events if e.kind == "push"]
    assert len(pushes) == 12


@pytest.mark.slow
def test_checkpoint_in_processes_resumes_in_reference(tmp_path: Path) -> None:
    full = run("1f1b-flush", PLAN2, backend="gloo", steps=4, checkpoint_every=2, checkpoint_dir=tmp_path)
    resumed = run("1f1b-flush", PLAN2, backend="local", steps=4, resume=tmp_path / "step-00000002")
    assert H.max_diff(resumed.state_dict(), full.state_dict()) == 0.0


def test_runtime_options_split_and_checked() -> None:
    from pipelab.runtime.options import RuntimeOptions, split_options

    def checked(method: str, options: dict) -> RuntimeOptions:
        return RuntimeOptions.from_options(method, split_options(method, options)[1])

    sched, rt = split_options("buffered", {"versions": 3, "compression": "int8", "recompute": True})
    assert sched == {"versions": 3} and rt == {"compression": "int8", "recompute": True}
    with pytest.raises(ValueError, match="belongs to method 'pipemare'"):
        split_options("gpipe", {"decay": 0.5})
    with pytest.raises(ValueError, match="needs checkpoint_dir"):
        checked("gpipe", {"checkpoint_every": 2})
    with pytest.raises(ValueError, match="int >= 1"):
        checked("gpipe", {"checkpoint_every": 0, "checkpoint_dir": "x"})
    with pytest.raises(ValueError, match="needs checkpoint_every"):
        checked("gpipe", {"checkpoint_dir": "x"})
    with pytest.raises(ValueError, match="must be in"):
        checked("pipemare", {"decay": 1.5})
    with pytest.raises(ValueError, match="multiple of 4"):
        run("hetpipe", HET2, microbatches=1, steps=6, D=0)


# ---------------------------------------------------------------------- versions come from the schedule
def test_runtime_reads_the_versions_the_schedule_names() -> None:
    # 2BW's and the 3-version buffer's schedules have the same actions and differ only in the
    # versions they name; a 2bw run given the buffer's versions must train exactly as the buffer
    # does, so the runtime takes its versions from the schedule and derives none of its own
    import dataclasses

    two = build("2bw", PLAN3, microbatches=2, minibatches=6)
    three = build("buffered", PLAN3, microbatches=2, minibatches=6, versions=3)
    assert two.actions == three.actions and two.versions != three.versions
    relabeled = dataclasses.replace(two, versions=three.versions)
    got = run("2bw", PLAN3, schedule=relabeled)
    want = run("buffered", PLAN3, versions=3)
    assert H.max_diff(got.state_dict(), want.state_dict()) == 0.0
    assert H.max_diff(run("2bw", PLAN3).state_dict(), want.state_dict()) > 1e-6
    # a version the method's weights cannot give is refused, naming the action
    stash = build("pipedream", PLAN3, minibatches=4)
    w0 = stash.stage_ranks[1][0]
    i = next(i for i, a in enumerate(stash.actions[w0]) if a.kind == "F" and a.microbatch == 3)
    bad = [list(v) for v in stash.versions or ()]
    bad[w0][i] += 1
    with pytest.raises(RuntimeError, match="forward of microbatch 3 reads weight version"):
        run("pipedream", PLAN3, microbatches=1, steps=4,
            schedule=dataclasses.replace(stash, versions=tuple(tuple(v) for v in bad)))
