"""The discrete-event simulator against closed forms, hand-computed timelines, the cost model's
memory formula and the partitioners' predictions."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipelab.cluster import Cluster
from pipelab.costs import CostModel
from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile
from pipelab.schedules import build
from pipelab.schedules.actions import Action
from pipelab.schedules.dataflow import Costs, UnitCosts
from pipelab.sim import simulate, simulate_schedule

DATA = Path(__file__).resolve().parents[1] / "pipelab" / "data" / "pipedream"


def test_gpipe_and_1f1b_bubble_closed_form() -> None:
    """Bubble fraction (P-1)/(M+P-1) on every worker, for any F:B ratio (GPipe §2.2)."""
    for P in range(1, 7):
        for M in range(1, 13):
            expect = (P - 1) / (M + P - 1)
            for method in ("gpipe", "1f1b-flush"):
                res = simulate_schedule(build(method, P, microbatches=M), UnitCosts(f=1.0, b=2.0, w=0.0))
                assert res.bubble_fraction == pytest.approx([expect] * P, abs=1e-12)
                assert res.time_per_minibatch == pytest.approx(3.0 * (M + P - 1))


def test_interleaved_bubble_closed_form() -> None:
    """Megatron interleaved 1F1B: (P-1)/(v*M + P-1) with per-chunk costs 1/v (Narayanan et al. SC'21 §2.2)."""
    for P in (2, 3, 4):
        for v in (1, 2, 3):
            for M in (P, 2 * P, 3 * P):
                res = simulate_schedule(build("interleaved-1f1b", P, microbatches=M, chunks=v),
                                        UnitCosts(f=1.0 / v, b=1.0 / v, w=0.0))
                assert res.bubble_fraction == pytest.approx([(P - 1) / (v * M + P - 1)] * P, abs=1e-9)


def test_zb_h1_third_of_1f1b_bubble() -> None:
    """Equal F, B, W: ZB-H1's bubble (P-1)(F+B-W) is a third of 1F1B's (P-1)(F+B+W) (Qi et al. §3.1)."""
    for P in range(2, 9):
        for M in (P, 2 * P, 16):
            zb = simulate_schedule(build("zb-h1", P, microbatches=M), UnitCosts())
            fl = simulate_schedule(build("1f1b-flush", P, microbatches=M), UnitCosts())
            assert fl.bubble_time == pytest.approx([3.0 * (P - 1)] * P)
            assert zb.bubble_time == pytest.approx([P - 1.0] * P)
            # memory: no stage holds more microbatches than 1F1B's first stage (P)
            assert max(zb.schedule.in_flight(s) for s in range(P)) == min(P, M)


@dataclass(frozen=True)
class StageCosts(Costs):
    """Per-stage forward/backward seconds, optional fixed transfer time."""

    f: tuple[float, ...]
    b: tuple[float, ...]
    send_s: float = 0.0

    def compute(self, worker: int, action: Action, split: bool) -> float:
        return {"F": self.f[action.stage], "B": self.b[action.stage]}.get(action.kind, 0.0)

    def send(self, src: int, dst: int, action: Action) -> tuple[float, int]:
        return (self.send_s, 100) if src != dst else (0.0, 0)

    def allreduce(self, stage: int, workers: tuple[int, ...], grad_s: float) -> tuple[float, float, int]:
        return grad_s, 0.0, 0


def test_pipedream_steady_state_zero_bubble() -> None:
    """Straight and replica-balanced PipeDream pipelines have no bubble once full."""
    for P in range(1, 7):
        res = simulate_schedule(build("pipedream", P, minibatches=6 * P), UnitCosts())
        assert res.bubble_fraction == pytest.approx([0.0] * P, abs=1e-12)
        assert res.time_per_minibatch == pytest.approx(3.0)   # F=1, B=b+w=2
    # HetPipe: two virtual workers, no all-reduce between them: twice the throughput, no bubble
    plan = Plan.from_boundaries(3, [1, 2], [2, 2, 2])
    res = simulate_schedule(build("hetpipe", plan, minibatches=48), UnitCosts())
    assert res.time_per_minibatch == pytest.approx(1.5)
    assert res.bubble_fraction == pytest.approx([0.0] * 6, abs=1e-12)


def test_replicated_stage_balanced_pipedream() -> None:
    """'2-1' with stage 0 twice as slow (F=2, B=4 vs 1, 2), each input replica admitting NOAM =
    ceil(3/2) = 2 minibatches: one minibatch every 3 s (PipeDream's T_s / r_s), every worker busy,
    with the replicas' k-th updates all-reduced together."""
    plan = Plan.from_boundaries(2, [1], [2, 1])
    res = simulate_schedule(build("pipedream", plan, minibatches=40), StageCosts((2.0, 1.0), (4.0, 2.0)))
    assert res.time_per_minibatch == pytest.approx(3.0)
    assert res.bubble_fraction == pytest.approx([0.0] * 3, abs=1e-12)
    assert res.schedule.in_flight(0) == 2


def test_serialized_link_closed_form() -> None:
    """GPipe P=2 with F=B=1 and a 3 s transfer: forwards queue on one link, gradients on the other;
    makespan = 6M + 4 (worked out by hand: last activation arrives at 3M+1, ...)."""
    for M in (1, 2, 5):
        res = simulate_schedule(build("gpipe", 2, microbatches=M), StageCosts((1.0, 1.0), (1.0, 1.0), 3.0))
        assert res.makespan == pytest.approx(6 * M + 4)
        sends = [e for e in res.trace if e.kind == "send"]
        assert len(sends) == 2 * M and all(e.bytes == 100 for e in sends)
        for a, b in zip(sorted(sends, key=lambda e: e.start_s), sorted(sends, key=lambda e: e.start_s)[1:]):
            if a.worker == b.worker:
                assert b.start_s >= a.end_s - 1e-12   # one at a time per directed link


@pytest.mark.parametrize("f, b", [(1.0, 1.0), (1.0, 2.0), (2.0, 1.0)])
def test_1f1b_pays_the_message_latency_once_per_microbatch_and_gpipe_twice_per_minibatch(f: float,
                                                                                        b: float) -> None:
    """P=2, one-way latency L <= min(F, B): GPipe (M+1)(F+B) + 2L (only the pipeline's turn waits);
    1F1B-flush (M+1)(F+B) + 2*ceil(M/2)*L (stage 0's next backward waits on each gradient's round
    trip). Worked out by hand: equal at L = 0 or M <= 2, so no latency lets 1F1B beat GPipe at equal M."""
    for M in (1, 2, 3, 4, 5, 8):
        for L in (0.0, 0.25, 0.5, 1.0):
            c = UnitCosts(f=f, b=b, w=0.0, send_s=L)
            gpipe = simulate_schedule(build("gpipe", 2, microbatches=M), c).makespan
            ofob = simulate_schedule(build("1f1b-flush", 2, microbatches=M), c).makespan
            assert gpipe == pytest.approx((M + 1) * (f + b) + 2 * L)
            assert ofob == pytest.approx((M + 1) * (f + b) + 2 * math.ceil(M / 2) * L)


def test_allreduce_waits_for_all_replicas() -> None:
    """dp on 2 workers, F=B=1, an all-reduce of 5 s that starts with the backward: U at 1 + 5."""
    res = simulate_schedule(build("dp", 2, microbatches=2), UnitCosts(f=1.0, b=1.0, w=0.0, allreduce_s=5.0))
    assert res.makespan == pytest.approx(6.0)
    ar = [e for e in res.trace if e.kind == "allreduce"]
    assert len(ar) == 2 and all(e.end_s == pytest.approx(6.0) for e in ar)


@pytest.mark.parametrize("method, kw", [("gpipe", {"microbatches": 4}), ("pipedream", {}),
                                        ("zb-h1", {"microbatches": 4}), ("2bw", {"microbatches": 4}),
                                        ("interleaved-1f1b", {"microbatches": 4, "chunks": 2})])
def test_trace_executes_the_schedule(method: str, kw: dict[str, int]) -> None:
    """The trace's per-worker compute actions are exactly the schedule's lists."""
    sch = build(method, 4, **kw)
    res = simulate_schedule(sch)
    assert res.trace.actions_by_worker() == {w: [str(a) for a in acts] for w, acts in enumerate(sch.actions)}
    assert len(res.trace.compute_events()) == len(sch)


def _uniform(n: int = 8, param: int = 1000, out: int = 10_000) -> Profile:
    return Profile.synthetic(
        [1e-3] * n, [2e-3] * n, out_bytes=[out] * n, param_bytes=[param] * n, batch_size=32
    )


def _without_grads_at_peak(want: dict[str, int], act: int) -> int:
    """The peak where each update frees the gradient buffer and a forward follows it (torch's
    ``zero_grad(set_to_none=True)``): all activations without gradients, or one microbatch fewer with them."""
    return want["total"] - min(want["gradients"], act)


def test_memory_matches_cost_model() -> None:
    """Peak memory per worker = CostModel.memory_bytes with PipeDream's versions and in-flight counts,
    less the gradient buffer that each update frees and the next weight gradient allocates."""
    prof = _uniform()
    cl = Cluster.flat(4, bandwidth=1e12)
    cm = CostModel(prof, cl)
    plan = Plan.even(8, 4, batch_size=32)
    res = simulate(plan, prof, cl, method="pipedream", minibatches=16)
    for s, st in enumerate(plan.stages):
        want = cm.memory_bytes(st.start, st.end, versions=4 - s, in_flight=4 - s)
        assert res.peak_memory[s] == _without_grads_at_peak(want, cm.activation_bytes(st.start, st.end))
    flush = simulate(plan, prof, cl, method="gpipe", microbatches=4, minibatches=2)
    for s, st in enumerate(plan.stages):
        want = cm.memory_bytes(st.start, st.end, versions=1, in_flight=4, microbatches=4)
        assert flush.peak_memory[s] == _without_grads_at_peak(want, cm.activation_bytes(st.start, st.end, 4))
    # 1F1B-flush with M > P: forwards follow the minibatch's first backward, so the peak holds it all
    one = simulate(plan, prof, cl, method="1f1b-flush", microbatches=8, minibatches=2)
    for s, st in enumerate(plan.stages):
        want = cm.memory_bytes(st.start, st.end, versions=1, in_flight=4 - s, microbatches=8)
        assert one.peak_memory[s] == want["total"]
    assert all(t1 >= t0 for line in res.memory_timeline.values() for (t0, _), (t1, _) in zip(line, line[1:]))


def test_memory_counts_the_gradient_buffer_and_optimizer_state_when_allocated() -> None:
    """Before the first update there is no optimizer state; between an update and the next weight
    gradient there is no gradient buffer (one stage, gpipe, M = 2, K = 2)."""
    prof = _uniform(n=2)
    cl = Cluster.flat(1, bandwidth=1e12)
    cm = CostModel(prof, cl)          # sgd-momentum: one state tensor per weight
    res = simulate(1, prof, cl, method="gpipe", microbatches=2, minibatches=2)
    p, a = cm.param_bytes(0, 2), cm.activation_bytes(0, 2, 2)
    # start, F0 F1 B0 B1 U, F2 F3 B2 B3 U
    assert [b for _, b in res.memory_timeline[0]] == [
        p, p + a, p + 2 * a, 2 * p + a, 2 * p, 2 * p,
        2 * p + a, 2 * p + 2 * a, 3 * p + a, 3 * p, 2 * p]


@pytest.mark.parametrize("method,kw,versions", [
    ("pipedream", {}, lambda P, s: P - s),
    ("pipedream", {"vertical_sync": True}, lambda P, s: P),     # also the versions of forwards still to come
    ("naive-async", {}, lambda P, s: 1),
    ("pipemare", {}, lambda P, s: 1),
    ("2bw", {"microbatches": 4}, lambda P, s: 2),
    ("buffered", {"microbatches": 4, "versions": 3}, lambda P, s: 3),
])
def test_memory_versions_follow_the_closed_forms(method: str, kw: dict, versions: Any) -> None:
    """The simulator charges the versions the schedule (and the runtime) hold: closed forms per method,
    with PipeDream's in-flight activations ``P - s``; naive-async and PipeMare recompute the forward
    in backward (a stage keeps its input and output), and PipeMare keeps a weight-sized delta buffer."""
    prof = _uniform()
    cl = Cluster.flat(4, bandwidth=1e12)
    cm = CostModel(prof, cl)
    plan = Plan.even(8, 4, batch_size=32)
    res = simulate(plan, prof, cl, method=method, minibatches=16, **kw)
    M = res.schedule.microbatches
    latest = method in ("naive-async", "pipemare")
    for s, st in enumerate(plan.stages):
        assert res.schedule.versions_held(s) == versions(4, s)
        want = cm.memory_bytes(st.start, st.end, versions=versions(4, s), in_flight=4 - s, microbatches=M)
        act = cm.activation_bytes(st.start, st.end, M, recompute=latest)
        total = want["total"] - want["activations"] + (4 - s) * act
        total += want["weights"] if method == "pipemare" else 0
        if M == 1:   # an update after every backward frees the gradient buffer before the next forward
            total -= min(want["gradients"], act)
        assert res.peak_memory[s] == total, (method, s)


def test_compute_bound_pipeline_matches_stage_time() -> None:
    """Negligible transfers: PipeDream's time per minibatch = the slowest stage's F+B; 1F1B-flush's
    = (M+P-1) per-microbatch steps."""
    prof = _uniform()
    cl = Cluster.flat(4, bandwidth=1e15)
    plan = Plan.even(8, 4, batch_size=32)
    res = simulate(plan, prof, cl, method="pipedream", minibatches=24)
    assert res.time_per_minibatch == pytest.approx(6e-3, rel=1e-5)   # + the tiny optimizer step
    assert res.throughput == pytest.approx(32 / 6e-3, rel=1e-5)
    fl = simulate(plan, prof, cl, method="1f1b-flush", microbatches=8)
    assert fl.time_per_minibatch == pytest.approx((8 + 3) * 6e-3 / 8, rel=1e-3)
    # zb-h1 splits backward as the runtime does: stage 0's B has no input gradient to compute and its
    # W is the whole backward; a later stage's B is its layers' input gradients (half of each layer's
    # backward, unmeasured here) and its W the weight gradients plus the chain down to its first layer
    zb = simulate(plan, prof, cl, method="zb-h1", microbatches=8)
    for w, (b_want, w_want) in ((0, (0.0, 4e-3 / 8)), (1, (4e-3 / 8 / 2, 4e-3 / 8 * 0.75))):
        ev = [e for e in zb.trace.compute_events() if e.worker == w]
        assert [e.duration_s for e in ev if e.kind == "B"] == pytest.approx([b_want] * 8, abs=1e-12)
        assert [e.duration_s for e in ev if e.kind == "W"] == pytest.approx([w_want] * 8)


def test_dp_matches_replica_formula() -> None:
    """dp: each microbatch is a whole profile minibatch on one replica; per minibatch = replica time / W."""
    prof = _uniform(param=10**7)
    cl = Cluster.preset("pipedream-a", servers=1, gpus_per_server=4)
    cm = CostModel(prof, cl)
    res = simulate(Plan.from_boundaries(8, [], [4], batch_size=32), prof, cl, method="dp", minibatches=3)
    want = cm.replica_time_s(0, 8, [0, 1, 2, 3]) / 4
    assert res.time_per_minibatch == pytest.approx(want, rel=0.02)


# (model, cluster, partitioner, method): a few of the cases of tests/test_sim_vs_partition.py, which
# checks every shipped profile x cluster x partitioner and documents the remaining exceptions.
AGREE = [
    ("gnmt", "pipedream-c:4", "pipedream", "pipedream"),
    ("resnet50", "pipedream-c:4", "pipedream", "pipedream"),
    ("alexnet", "pipedream-c:4", "pipedream", "pipedream"),
    ("alexnet", "pipedream-b:2x8", "pipedream", "pipedream"),
    ("vgg16", "pipedream-a:4x4", "dp", "dp"),
    ("gnmt", "pipedream-b:2x8", "prefix-sum", "pipedream"),
    ("gnmt", "pipedream-a:4x4", "prefix-sum", "pipedream"),
]


@pytest.mark.parametrize("model, cluster, partitioner, method", AGREE)
def test_simulator_agrees_with_partitioner(model: str, cluster: str, partitioner: str, method: str) -> None:
    from pipelab.partition import partition

    prof = Profile.from_pipedream(DATA / f"{model}_graph.txt")
    cl = Cluster.parse(cluster)
    plan = partition(prof, cl, method=partitioner)
    res = simulate(plan, prof, cl, method=method)
    assert res.time_per_minibatch == pytest.approx(plan.time_per_minibatch, rel=0.10)


@pytest.mark.parametrize("policy", ["HD", "ED"])
def test_hetpipe_plan_simulates(policy: str) -> None:
    """A HetPipe plan (ranks mapped to cluster workers via notes['workers']) simulates near its prediction."""
    from pipelab.partition import partition

    prof = Profile.from_pipedream(DATA / "resnet50_graph.txt")
    cl = Cluster.preset("hetpipe")
    plan = partition(prof, cl, method="hetpipe", policy=policy)
    res = simulate(plan, prof, cl, method="hetpipe")
    assert res.schedule.options["allreduce"] is False
    assert res.time_per_minibatch == pytest.approx(plan.time_per_minibatch, rel=0.10)


def test_hetpipe_time_counts_1f1b_pair_cycle() -> None:
    """Closed form: stages of 0.09, 0.09, 0.003 s with a 0.03 s cut between the first two. In 1F1B
    stage 0 runs B(m), F(m+3), and stage 1 answers F(m+3) with B(m+2), so the pair finishes two
    minibatches per (0.09 + 0.09 + 2 * 0.03) s = 0.12 s each, above the compute bound (0.09) and the
    round trip (0.081) -- the simulator agrees, and so must the HetPipe prediction of one VW."""
    from pipelab.costs import CostModel
    from pipelab.partition.hetero import hetpipe_time_s

    prof = Profile.synthetic([0.03, 0.03, 0.001], [0.06, 0.06, 0.002], out_bytes=[3 * 10**8, 10**3, 10**3],
                             param_bytes=[10**6] * 3)
    cl = Cluster.flat(3, bandwidth=1e10)
    plan = Plan.from_boundaries(3, [1, 2], [1, 1, 1])
    res = simulate(plan, prof, cl, method="hetpipe", minibatches=60)
    assert res.time_per_minibatch == pytest.approx(0.12, rel=1e-3)
    assert hetpipe_time_s(CostModel(prof, cl), [1, 2], [[0, 1, 2]]).time_s == pytest.approx(0.12, rel=1e-9)


def test_simulate_bad_input() -> None:
    from pipelab.schedules import ScheduleError

    prof = _uniform()
    with pytest.raises(ScheduleError, match="cluster"):
        simulate(Plan.even(8, 4), prof, Cluster.flat(2), method="gpipe")
    with pytest.raises(ValueError, match="layers"):
        simulate(Plan.even(6, 3), prof, Cluster.flat(4), method="gpipe")
    with pytest.raises(ScheduleError, match="stages"):
        simulate(Plan.even(8, 4), prof, Cluster.flat(4), schedule=build("gpipe", 3))
    with pytest.raises(ScheduleError, match="needs 32 virtual stages"):
        simulate(Plan.even(8, 4), prof, Cluster.flat(4), method="interleaved-1f1b", chunks=8)


def test_interleaved_resplits_plan_and_cli(tmp_path: Path) -> None:
    """interleaved-1f1b on a P-stage plan re-splits into v*P virtual stages; the CLI runs end to end."""
    from pipelab.cli.simulate import main

    prof = _uniform(16)
    res = simulate(Plan.even(16, 4, batch_size=32), prof, Cluster.flat(4, bandwidth=1e15),
                   method="interleaved-1f1b", chunks=2, microbatches=8)
    assert res.schedule.num_stages == 8
    assert res.bubble_fraction == pytest.approx([3 / (2 * 8 + 3)] * 4, rel=1e-3)
    path = prof.save(tmp_path / "p.json")
    chrome = tmp_path / "t.json"
    assert (
        main(
            [
                str(path),
                "--cluster",
                "flat:4",
                "--method",
                "1f1b-flush",
                "--partition",
                "prefix-sum",
                "--microbatches",
                "4",
                "--chrome",
                str(chrome),
                "--schedule-csv",
                str(tmp_path / "s.csv"),
            ]
        )
        == 0
    )
    assert chrome.exists() and (tmp_path / "s.csv").exists()
    assert main([str(tmp_path / "missing.json"), "--cluster", "flat:4"]) == 2
    assert not math.isnan(res.time_per_minibatch)


def test_allreduce_overlap_in_simulator() -> None:
    """The simulator prices a replicated stage's all-reduce as CostModel.allreduce_overlap says.

    Two layers, F = 1 ms, B = 2 ms each, 2 MB of weights in the last layer, 2 workers at 1 GB/s
    (kappa = 1 ns/byte: a 2 ms all-reduce). dp: a replica's minibatch takes 6 ms with DDP's overlap
    (layer 1's all-reduce hides behind layer 0's backward) and 8 ms without, so 3 and 4 ms per
    minibatch (+ the optimizer step, negligible here). Without overlap the all-reduce starts when
    the backward ends; with it, it ends with the backward."""
    prof = Profile.synthetic([1e-3, 1e-3], [2e-3, 2e-3], param_bytes=[0, 2 * 10**6], batch_size=8)
    cl = Cluster.flat(2, bandwidth=1e9)
    dp = Plan.from_boundaries(2, [], [2], batch_size=8)
    for overlap, want in (("ddp", 3e-3), ("none", 4e-3)):
        res = simulate(dp, prof, cl, method="dp", minibatches=4, allreduce_overlap=overlap,
                       memory_bandwidth=1e15)
        assert res.time_per_minibatch == pytest.approx(want, rel=1e-5)
        cm = CostModel(prof, cl, allreduce_overlap=overlap)
        assert res.time_per_minibatch == pytest.approx(cm.replica_time_s(0, 2, [0, 1]) / 2, rel=1e-5)
        ev = [e for e in res.trace if e.worker == 0]
        ar = [e for e in ev if e.kind == "allreduce"]
        last_b = [e for e in ev if e.kind == "B"]
        assert len(ar) == len(last_b) > 0
        for a, b in zip(ar, last_b):
            assert a.end_s - a.start_s == pytest.approx(2e-3)
            assert a.start_s == pytest.approx(b.end_s if overlap == "none" else b.end_s - 2e-3)
    # a replicated stage inside a pipeline: '2-1', stage 0 = layers [0, 2) with the weights in layer 1,
    # stage 1 = layer 2 (3 ms). Stage 0's replica: F 2 + B 4 ms, its 2 ms all-reduce hidden behind
    # layer 0's backward (ddp: 6 ms per 2 minibatches = 3) or after it (none: 8 ms per 2 = 4)
    p2 = Profile.synthetic([1e-3] * 3, [2e-3] * 3, param_bytes=[0, 2 * 10**6, 0], batch_size=8)
    cl3 = Cluster.flat(3, bandwidth=1e9)
    plan = Plan.from_boundaries(3, [2], [2, 1], batch_size=8)
    for overlap, want in (("ddp", 3e-3), ("none", 4e-3)):
        res = simulate(plan, p2, cl3, method="pipedream", minibatches=40, allreduce_overlap=overlap,
                       memory_bandwidth=1e15)
        assert res.time_per_minibatch == pytest.approx(want, rel=1e-5)
        ss = CostModel(p2, cl3, allreduce_overlap=overlap).steady_state([(0, 2), (2, 3)], [[0, 1], [2]])
        assert ss.time_s == pytest.approx(want) and ss.bottleneck == "compute 0"
    with pytest.raises(ValueError, match="allreduce_overlap"):
        simulate(dp, prof, cl, method="dp", allreduce_overlap="both")


def test_newest_weight_backward_recomputes_the_forward() -> None:
    # naive-async and PipeMare read the newest weights in B, not those F read: the runtime runs the
    # stage's forward again inside B (its F keeps no graph), so B costs F + B; stashing methods do not
    prof = Profile.synthetic([1e-3, 2e-3], bwd_s=[3e-3, 4e-3], out_bytes=[10, 0])
    cl = Cluster.flat(2, bandwidth=1e15)
    for method, extra in (("naive-async", (1e-3, 2e-3)), ("pipemare", (1e-3, 2e-3)), ("pipedream", (0, 0))):
        res = simulate(Plan.even(2, 2), prof, cl, method=method, minibatches=4)
        for w in (0, 1):
            b = [e.duration_s for e in res.trace.compute_events() if e.kind == "B" and e.worker == w]
            assert b == pytest.approx([(3e-3, 4e-3)[w] + extra[w]] * 4), method


def test_a_busy_sender_delays_messages_but_not_a_hand_off_on_its_own_worker() -> None:
    from dataclasses import dataclass

    from pipelab.schedules.actions import Action, Schedule
    from pipelab.schedules.dataflow import UnitCosts, run

    @dataclass(frozen=True)
    class Busy(UnitCosts):
        def busy_sender_s(self, src: int) -> float:
            return 10.0

    # stages 0 and 1 on worker 0: 0F0 hands its output to 1F0 in place, which starts at once
    local = Schedule("x", 2, ((0,), (0,)), 1, 1, (tuple(Action.parse(a) for a in ("0F0", "1F0")),))
    assert {e.action: e.start_s for e in run(local, Busy()) if e.kind == "F"}["1F0"] == pytest.approx(1.0)
    # across workers, 0F0's sender goes straight on to 0F1: the message leaves 10 s late
    acts = (tuple(Action.parse(a) for a in ("0F0", "0F1")), tuple(Action.parse(a) for a in ("1F0", "1F1")))
    two = Schedule("x", 2, ((0,), (1,)), 2, 1, acts)
    assert {e.action: e.start_s for e in run(two, Busy()) if e.kind == "F"}["1F0"] == pytest.approx(11.0)


def test_the_core_simulation_has_no_host_effect_unless_asked() -> None:
    """A calibrated cluster's host effects (pipelab.sim.host_effects) apply only with host_effects=True
    (or a record): the default simulation is the core model's, and a neutral record gives exactly the
    same result."""
    import dataclasses

    from pipelab.measured import Calibration, HostEffects

    host = HostEffects(busy_sender_s=3e-4)
    cal = Calibration(host="h", backend="gloo", device="cpu", date="d", torch="t", cores=2, workers=2,
                      p2p_latency_s=1e-5, p2p_bandwidth=1e9, allreduce_latency_s=1e-5,
                      allreduce_bandwidth=1e9, overhead_s={}, optimizer_s={}, memory_bandwidth=1e10,
                      host_effects=host)
    cl = dataclasses.replace(Cluster.flat(2), calibration=cal)
    prof = Profile.synthetic([1e-3] * 4, out_bytes=[4096] * 4, batch_size=8)
    core = simulate(2, prof, cl, "1f1b-flush", microbatches=4, minibatches=3)
    neutral = simulate(2, prof, cl, "1f1b-flush", microbatches=4, minibatches=3, host_effects=HostEffects())
    assert neutral.time_per_minibatch == core.time_per_minibatch
    with_host = simulate(2, prof, cl, "1f1b-flush", microbatches=4, minibatches=3, host_effects=True)
    assert with_host.time_per_minibatch > core.time_per_minibatch
    assert host.terms == ("busy_sender",) and host.without(*host.terms) == HostEffects()
    assert host.without(*host.terms).terms == ()
    with pytest.raises(ValueError, match="not calibrated"):
        simulate(2, prof, Cluster.flat(2), "1f1b-flush", microbatches=4, host_effects=True)
    with pytest.raises(ValueError, match="unknown host terms"):
        host.without("cross")


def test_a_tensor_parallel_plan_without_a_recorded_split_is_refused_naming_the_stage() -> None:
    import dataclasses

    from pipelab.views import memory_breakdown

    prof = Profile.synthetic([1e-3] * 4, [2e-3] * 4, param_bytes=[10**6] * 4, batch_size=4)
    plan = Plan.from_boundaries(4, [2])
    split = dataclasses.replace(plan, stages=(plan.stages[0], dataclasses.replace(plan.stages[1], tensor=2)))
    with pytest.raises(ValueError, match=r"stage 1 has tensor degree 2, but profile 'synthetic' records no "
                                         r"tensor split.*tensor_parallel_plan.*pl.simulate_llm"):
        simulate(split, prof, "flat:3", "1f1b-flush", microbatches=2)
    with pytest.raises(ValueError, match=r"stage 1 has tensor degree 2, but profile 'synthetic' records no"):
        memory_breakdown(split, prof)
    assert simulate(plan, prof, "flat:2", "1f1b-flush", microbatches=2).time_per_minibatch > 0
