"""Whole LLM jobs simulated as one pipeline (pipelab.sim.llm) and the LLM planner (pipelab.planner.llm).

Oracles: the FLOP formula of Narayanan et al. SC'21 §5.1 written out here; the 1F1B closed form
``(m + p - 1)(F + B)`` for equal stages (§2.2); the schedule the builder makes (one schedule); brute force
over every configuration for the planner's pick.
"""

from __future__ import annotations

import math

import pytest

from pipelab.llm.parallel import Parallel
from pipelab.llm.shape import Transformer
from pipelab.planner.llm import PlanInfeasible, enumerate_parallel, plan_llm
from pipelab.schedules import build
from pipelab.schedules.dataflow import run
from pipelab.sim.llm import FoldedCosts, StageTimes, hardware_flops, model_flops, simulate_llm

GPT = Transformer(name="gpt-test", layers=8, hidden=1024, heads=16, seq=1024, vocab=32000)


def test_flops_match_narayanan_formula():
    """Full recomputation's hardware FLOPs are SC'21's 96 B s l h^2 (1 + s/6h + V/16lh); model FLOPs the
    same without the recomputed forward: 72 B s l h^2 (1 + s/6h) + 6 B s h V."""
    B, s, L, h, V = 16, GPT.seq, GPT.layers, GPT.hidden, GPT.vocab
    want_hw = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    want_model = 72 * B * s * L * h * h * (1 + s / (6 * h)) + 6 * B * s * h * V
    assert math.isclose(hardware_flops(GPT, B, "full"), want_hw, rel_tol=1e-12)
    assert math.isclose(model_flops(GPT, B), want_model, rel_tol=1e-12)
    # selective recomputation adds only the attention core's forward: 4 B s^2 h per layer
    assert math.isclose(hardware_flops(GPT, B, "selective") - model_flops(GPT, B), 4 * B * s * s * h * L,
                        rel_tol=1e-12)


@pytest.mark.parametrize("p,m", [(2, 3), (4, 8), (8, 16)])
def test_folded_costs_give_the_1f1b_closed_form(p, m):
    """Equal stages, free sends: one pipeline's 1F1B iteration is (m + p - 1)(F + B + W) + the step's end."""
    f, b, w, tf, tb, end = 1.0, 1.5, 0.5, 0.25, 0.25, 0.75
    stages = [StageTimes(forward_s=f, backward_input_s=b, backward_weight_s=w, tensor_forward_s=tf,
                         tensor_backward_s=tb, send_s=0.0, send_bytes=0)] * p
    events = run(build("1f1b-flush", p, microbatches=m), FoldedCosts(stages, end))
    makespan = max(e.end_s for e in events)
    assert math.isclose(makespan, (m + p - 1) * (f + tf + b + tb + w) + end)


def test_simulate_llm_is_one_pipeline_with_folded_communication():
    par = Parallel(tensor=2, pipeline=4, data=2, microbatch_size=1, microbatches=8, sequence_parallel=True)
    res = simulate_llm(GPT, "dgx-a100:16", par)
    # the one schedule: the builder's, action for action
    sch = build("1f1b-flush", 4, microbatches=8)
    assert res.trace.actions_by_worker() == {w: [str(a) for a in acts] for w, acts in enumerate(sch.actions)}
    kinds = {e.kind for e in res.trace.events}
    assert {"tensor", "allreduce", "send"} <= kinds
    assert "simulated one pipeline" in repr(res) and "t=2 folded" in repr(res) and "d=2 folded" in repr(res)
    # bounds: never faster than the slowest worker's busy time, never slower than the 1F1B closed form
    per_stage = [st.forward_total_s + st.backward_total_s for st in res.costs.stages]
    end = res.costs.dp_exposed_s + res.costs.sharding_gather_s + res.costs.optimizer_s
    sends = sum(st.p2p_s for st in res.costs.stages)
    assert res.time_per_iteration_s >= 8 * max(per_stage) + end - 1e-12
    assert res.time_per_iteration_s <= (8 + 4 - 1) * max(per_stage) + 2 * sends + end + 1e-12
    # both FLOP conventions, per GPU, over the iteration
    assert math.isclose(res.model_tflops_per_gpu * 1e12 * 16 * res.time_per_iteration_s, model_flops(GPT, 16))
    assert res.hardware_flops == res.model_flops      # no recomputation
    assert 0 < res.model_flops_utilization < 1 and 0 < res.bubble_fraction < 1
    assert len(res.memory) == 4 and res.peak_memory == max(m.total for m in res.memory)


def test_interleaving_keeps_each_workers_work_and_shrinks_the_bubble():
    base = dict(tensor=1, pipeline=4, data=1, microbatch_size=1, microbatches=8)
    plain = simulate_llm(GPT, "dgx-a100:4", Parallel(**base))
    inter = simulate_llm(GPT, "dgx-a100:4", Parallel(**base, virtual=2, schedule="interleaved"))
    assert inter.schedule.num_stages == 8
    busy = {w: 0.0 for w in range(4)}
    for e in inter.trace.compute_events():
        if e.kind != "U":
            busy[e.worker] += e.duration_s
    for w, st in enumerate(inter.costs.stages):
        assert math.isclose(busy[w], 8 * (st.forward_total_s + st.backward_total_s))
    assert inter.bubble_fraction < plain.bubble_fraction


def test_method_must_agree_with_the_parallel_schedule():
    par = Parallel(tensor=1, pipeline=2, data=1, microbatches=4)
    with pytest.raises(ValueError, match="disagrees with Parallel"):
        simulate_llm(GPT, "dgx-a100:2", par, method="gpipe")
    with pytest.raises(ValueError, match="no whole-job simulation"):
        simulate_llm(GPT, "dgx-a100:2", Parallel(pipeline=2, microbatches=4, schedule="zb-h2"))


def test_planner_picks_the_brute_force_best():
    """Every configuration simulated: the planner's pick (closed-form shortlist, then simulation) is the
    fastest one that fits memory."""
    model = Transformer(name="gpt-6.7b", layers=32, hidden=4096, heads=32, seq=2048, vocab=51200)
    space = dict(microbatch_size=(1, 2), recompute=("none", "selective", "full"), sharding=("none", "zero1"),
                 virtual=(2,))
    table = plan_llm(model, "dgx-a100:16", 32, **space)
    limit = table.memory_limit
    best = math.inf
    fits = 0
    for par in enumerate_parallel(model, table_cluster(), 32, **space):
        try:
            res = simulate_llm(model, "dgx-a100:16", par)
        except ValueError:
            continue
        if res.peak_memory <= limit:
            fits += 1
            best = min(best, res.time_per_iteration_s)
    assert table.refused_memory > 0                 # memory decides some of it
    assert fits == len(table.candidates)
    assert math.isclose(table.best.time_s, best, rel_tol=1e-12)
    assert "beats" in table.explain() and "GiB" in table.explain()
    df = table.to_dataframe()
    assert len(df) == fits and {"tensor", "pipeline", "data", "simulated_s", "mfu"} <= set(df.columns)


def table_cluster():
    from pipelab.cluster import Cluster
    return Cluster.of("dgx-a100:16")


def test_planner_refuses_what_does_not_fit_with_the_figures():
    model = Transformer.preset("gpt3-175b")
    with pytest.raises(PlanInfeasible) as info:
        plan_llm(model, "dgx-a100:8", 8, tensor=8, pipeline=1, recompute="full")
    text = str(info.value)
    assert "GiB per device" in text and "weights" in text and "optimizer" in text and "80.0 GiB" in text


def test_planner_refuses_a_batch_that_does_not_divide():
    with pytest.raises(PlanInfeasible, match="divides"):
        plan_llm(GPT, "dgx-a100:8", 7, tensor=8, pipeline=1, microbatch_size=2)


@pytest.mark.slow
def test_planner_ranks_one_trillion_on_3072_gpus():
    model = Transformer(name="gpt-1T", layers=128, hidden=25600, heads=160, seq=2048, vocab=51200)
    table = plan_llm(model, "dgx-a100:3072", 3072)
    assert table.best.result is not None and table.best.parallel.devices == 3072
    assert table.best.time_s <= min(c.time_s for c in table.simulated)


def test_the_gantt_draws_tensor_and_data_communication():
    from pipelab.views import gantt
    par = Parallel(tensor=2, pipeline=2, data=2, microbatch_size=1, microbatches=4, sequence_parallel=True)
    fig = gantt(simulate_llm(GPT, "dgx-a100:8", par).trace)
    drawn = {k for tr in fig.data if tr.name == "transfer" for k in tr.text}
    assert {"tensor", "allreduce", "send"} <= drawn


def test_plan_table_round_trips_through_json(tmp_path):
    from pipelab.planner.llm import LlmPlanTable
    table = plan_llm(GPT, "dgx-a100:8", 16, tensor=(2, 4), microbatch_size=1, recompute="none",
                     sharding="none", shortlist=2)
    back = LlmPlanTable.load(table.save(tmp_path / "plan.json"))
    assert back.to_dict() == table.to_dict()
    assert [c.time_s for c in back.candidates] == [c.time_s for c in table.candidates]
    assert back.explain() == table.explain()
