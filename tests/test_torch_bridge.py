"""The torch bridge without processes: the pinned private API, importing torch's schedules (against
pipelab's own builders, torch's own validator and the Zero Bubble paper's closed forms), exporting
pipelab's (round trips through torch's CSV format), and the refusals of what torch cannot run.
The multi-process proof that both engines train to the same weights is test_torch_bridge_mp.py.
"""

from __future__ import annotations

import re
from collections import namedtuple

import pytest
import test_runtime_helpers as H
import torch

import pipelab as pl
from pipelab.schedules import torch_api
from pipelab.schedules.dataflow import UnitCosts
from pipelab.schedules.torch_format import from_torch, to_torch_csv, to_torch_order
from pipelab.sim.simulate import StageMemory, simulate_schedule
from pipelab.torch_bridge import stage_modules, to_torch

ScheduleError = pl.schedules.ScheduleError
EQUAL = UnitCosts(f=1.0, b=1.0, w=1.0)    # T_F = T_B = T_W, the paper's analysis


# ---------------------------------------------------------------------------- the pin
def test_the_bridge_is_pinned_to_the_torch_the_project_installs(repo_root):
    make = (repo_root / "Makefile").read_text(encoding="utf-8")
    installs = re.search(r"torch==([0-9.]+)", make)
    assert installs and installs.group(1) == torch_api.TESTED_TORCH, (
        "the Makefile installs another torch than the bridge was checked against: check "
        "pipelab/schedules/torch_api.py against the new torch and update TESTED_TORCH")
    assert torch_api.torch_version() == torch_api.TESTED_TORCH, (
        f"torch {torch_api.torch_version()} is installed but the torch bridge was checked against "
        f"{torch_api.TESTED_TORCH}: re-run tests/test_torch_bridge*.py and update TESTED_TORCH")


def test_every_private_name_the_bridge_uses_is_there():
    assert torch_api.problems() == []
    torch_api.require()


@pytest.fixture
def fresh_check():
    torch_api._checked.cache_clear()
    yield
    torch_api._checked.cache_clear()


def test_a_changed_private_api_fails_naming_what_changed(monkeypatch, fresh_check):
    from torch.distributed.pipelining import schedules as mod

    Renamed = namedtuple("Renamed", ["stage", "kind", "microbatch", "subs"])
    monkeypatch.setattr(mod, "_Action", Renamed)
    monkeypatch.delattr(mod._PipelineScheduleRuntime, "_prepare_schedule_with_comms")
    found = torch_api.problems()
    assert any("_Action has fields ('stage', 'kind', 'microbatch', 'subs')" in p for p in found), found
    assert any("_prepare_schedule_with_comms is missing" in p for p in found), found
    with pytest.raises(torch_api.TorchAPIError, match=r"torch==2\.14\.1.*pl\.train"):
        from_torch("GPipe", workers=2, microbatches=2)


def test_a_changed_signature_is_reported(monkeypatch, fresh_check):
    from torch.distributed.pipelining import schedules as mod


    def moved(self, filename, fmt="compute_only"):   # a parameter renamed
        raise AssertionError("never called")

    monkeypatch.setattr(mod._PipelineScheduleRuntime, "_load_csv", moved)
    assert any("_load_csv takes ('self', 'filename', 'fmt')" in p for p in torch_api.problems())


# ---------------------------------------------------------------------------- import
@pytest.mark.parametrize("P,M", [(2, 2), (3, 6), (4, 8), (4, 12)])
def test_torch_gpipe_and_interleaved_1f1b_import_as_pipelab_builds_them(P, M):
    """An independent oracle: torch's own builders give exactly pipelab's per-worker lists."""
    assert from_torch("GPipe", workers=P, microbatches=M).actions == \
        pl.schedules.build("gpipe", P, microbatches=M, minibatches=1).actions
    imported = from_torch("Interleaved1F1B", workers=P, microbatches=M, minibatches=2)
    built = pl.schedules.build("interleaved-1f1b", P, microbatches=M, minibatches=2, chunks=2)
    assert imported.actions == built.actions and imported.stage_ranks == built.stage_ranks
    assert imported.options["placement"] == "loop"


def _bubble(make, busy):
    """Steady-state idle time per minibatch on the busiest worker: the time one more minibatch adds to the
    run (updates are per stage, with no synchronization across stages: the Zero Bubble paper's §4
    'post-validation' setting), less one worker's compute per minibatch."""
    a = simulate_schedule(make(4), EQUAL).makespan
    b = simulate_schedule(make(5), EQUAL).makespan
    return b - a - busy


@pytest.mark.parametrize("P", [2, 3, 4])
def test_imported_zbv_is_valid_and_has_the_papers_zero_bubble(P):
    """Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR'24; ZB-V in §6 of arXiv:2401.10241, and the
    authors' table for T_F = T_B = T_W): 1F1B idles (p-1)(T_F+T_B+T_W) per minibatch, ZB-H1 (p-1)(T_F+T_B-T_W)
    (§2.1, a third of it), ZB-V 0, with the activation memory of 1F1B. torch's ZB-V needs M >= 2P - 1
    microbatches to fill its V (it pads its own order to that many)."""
    for M in (2 * P - 1, 2 * P, 3 * P):
        def zbv_k(K: int, M: int = M) -> pl.Schedule:
            return from_torch("ZBVZeroBubble", workers=P, microbatches=M, minibatches=K)

        def built(method: str, M: int = M):
            return lambda K: pl.schedules.build(method, P, microbatches=M, minibatches=K)

        zbv = zbv_k(1)
        pl.schedules.validate(zbv, in_order=False)
        # sent right after the action that makes it, V's messages cross between the two chunks of a
        # pair: in-order matching (NCCL) needs torch's explicit send steps, and rule 6 says so
        with pytest.raises(pl.schedules.ScheduleError, match="per-pair message order"):
            pl.schedules.validate(zbv)
        assert zbv.num_stages == 2 * P and zbv.options["placement"] == "v"
        assert zbv.stage_ranks == tuple((s if s < P else 2 * P - 1 - s,) for s in range(2 * P))
        assert all(any(a.kind == "W" and a.stage == s for a in zbv.actions[zbv.stage_ranks[s][0]])
                   for s in range(2 * P))
        # equal costs per chunk (half a stage): a worker computes 2 chunks x M x (F + B + W) per minibatch
        assert _bubble(zbv_k, 2 * 3 * M) == pytest.approx(0.0)
        assert _bubble(built("1f1b-flush"), 3 * M) == pytest.approx(3 * (P - 1))
        assert _bubble(built("zb-h1"), 3 * M) == pytest.approx(P - 1)
        # activations: one unit per chunk and microbatch held -> 2P chunks = P whole stages on every worker,
        # 1F1B's peak (P microbatches at its first stage)
        mem = {s: StageMemory(model_states=0, activations=1, weights=0) for s in range(2 * P)}
        assert simulate_schedule(zbv, EQUAL, memory=mem).peak_memory == (2 * P,) * P


def test_dualpipev_overlaps_and_full_backwards_map_onto_pipelab_actions():
    mod = torch_api.require()
    P, M = 3, 6
    sch = from_torch("DualPipeV", workers=P, microbatches=M)
    pl.schedules.validate(sch, in_order=False)
    assert sch.method == "torch:DualPipeV" and sch.options["placement"] == "v"
    # torch's own order, overlaps unpacked and full backwards as B then W: the same lists
    torch_order = _torch_order(mod.ScheduleDualPipeV, P, M)
    for w, row in torch_order.items():
        expect = []
        for a in row:
            for sub in (a.sub_actions or (a,)):
                k, s, m = sub.computation_type.value, sub.stage_index, sub.microbatch_index
                expect += {"F": [f"{s}F{m}"], "I": [f"{s}B{m}"], "W": [f"{s}W{m}"],
                           "B": [f"{s}B{m}", f"{s}W{m}"]}[k]
        assert [str(a) for a in sch.actions[w] if a.kind != "U"] == expect
    assert any(a.sub_actions for row in torch_order.values() for a in row)   # it had overlaps


def _torch_order(cls, P, M):
    from pipelab.schedules.torch_format import _StandIn

    stages = [_StandIn(stage_index=c * P, num_stages=2 * P, group_size=P) for c in range(2)]
    order = cls(stages, M, loss_fn=None).pipeline_order
    return {r: [a for a in acts if a is not None] for r, acts in order.items()}


def test_every_named_torch_schedule_imports_valid():
    for name in pl.schedules.torch_format.torch_schedule_names():
        if name == "1F1B":
            continue      # torch 2.14.1's Schedule1F1B order IR is off by one on its last rank (below)
        sch = from_torch(name, workers=2, microbatches=4, minibatches=2)
        pl.schedules.validate(sch, in_order=name not in ("ZBVZeroBubble", "InterleavedZeroBubble"))
        assert sch.minibatches == 2 and len(sch) > 0


def test_a_torch_object_imports_and_a_gantt_is_drawn():
    mod = torch_api.require()
    from pipelab.schedules.torch_format import _StandIn

    obj = mod.ScheduleZBVZeroBubble([_StandIn(0, 4, 2), _StandIn(3, 4, 2)], 4, loss_fn=None)
    sch = from_torch(obj)
    assert sch.actions == from_torch("ZBVZeroBubble", workers=2, microbatches=4).actions
    fig = pl.views.gantt(sch)
    kinds = ("forward", "backward", "weight grad")
    drawn = sum(len(t.x) for t in pl.views.action_traces(fig) if t.type == "bar" and t.name in kinds)
    assert drawn == sum(1 for acts in sch.actions for a in acts if a.kind != "U")


def test_bad_torch_input_is_refused_saying_what_is_wrong(tmp_path):
    with pytest.raises(ScheduleError, match="not a torch schedule.*ZBVZeroBubble"):
        from_torch("ZeroBubbleV2", workers=2, microbatches=4)
    with pytest.raises(ScheduleError, match="needs workers=P"):
        from_torch("ZBVZeroBubble", microbatches=4)
    with pytest.raises(ScheduleError, match="microbatches beyond the 2 of a step"):
        from_torch({0: ["0F0", "0F5", "0B0", "0B5"]}, microbatches=2)
    with pytest.raises(ScheduleError, match="stage 0 runs on ranks 0 and 1"):
        from_torch({0: ["0F0", "0B0"], 1: ["0F1", "0B1"]})
    with pytest.raises(ScheduleError, match="refuses 4 ranks x 2 stages each with 4 microbatches"):
        from_torch("DualPipeV", workers=4, microbatches=4)   # torch's own rule: M >= stages
    with pytest.raises(ScheduleError, match="does not exist"):
        from_torch(tmp_path / "missing.csv")
    broken = tmp_path / "broken.csv"
    broken.write_text("0F0,0B0\n1F0\n", encoding="utf-8")    # stage 1 never runs its backward
    with pytest.raises(ScheduleError, match="1B0 is missing"):
        from_torch(broken)


def test_torchs_1f1b_order_ir_is_refused_naming_its_bad_action():
    """torch 2.14.1's Schedule1F1B._get_pipeline_order (its IR, for drawing; its step() does not read it)
    gives the last rank F1..F8 for M = 8 (no F0): the importer refuses it instead of guessing."""
    with pytest.raises(ScheduleError, match=r"rank 3's actions \['3F8'\].*beyond the 8 of a step"):
        from_torch("1F1B", workers=4, microbatches=8)


# ---------------------------------------------------------------------------- export
SYNC = [("gpipe", 3, {}), ("1f1b-flush", 3, {}), ("zb-h1", 3, {}), ("interleaved-1f1b", 2, {"chunks": 2})]


@pytest.mark.parametrize("method,P,opts", SYNC, ids=[m for m, _, _ in SYNC])
def test_export_round_trips_through_torchs_csv_and_passes_torchs_validator(tmp_path, method, P, opts):
    mod = torch_api.require()
    sch = pl.schedules.build(method, P, microbatches=4, minibatches=3, **opts)
    path = to_torch_csv(sch, tmp_path / f"{method}.csv")
    rows = [line.split(",") for line in path.read_text(encoding="utf-8").splitlines()]
    actions = {r: [mod._Action.from_str(a) for a in row] for r, row in enumerate(rows)}
    mapping = mod._validate_schedule(actions, sch.num_workers, sch.num_stages, 4)   # torch's own check
    assert mapping == {s: rs[0] for s, rs in enumerate(sch.stage_ranks)}
    back = from_torch(path, minibatches=3)
    assert back.actions == sch.actions and back.stage_ranks == sch.stage_ranks
    letters = {a.computation_type.value for row in actions.values() for a in row}
    assert ("I" in letters) == (method == "zb-h1") and ("B" in letters) == (method != "zb-h1")


def test_imported_zbv_exports_back_to_torchs_own_order():
    mod = torch_api.require()
    order = _torch_order(mod.ScheduleZBVZeroBubble, 3, 6)
    assert to_torch_order(from_torch("ZBVZeroBubble", workers=3, microbatches=6, minibatches=2)) == \
        {r: [str(a) for a in row] for r, row in order.items()}


def test_asynchronous_methods_and_replicated_stages_are_refused_with_the_alternative():
    model = H.pair()
    for method in ("pipedream", "2bw", "naive-async", "pipemare"):
        sch = pl.schedules.build(method, 2, microbatches=None if method != "2bw" else 2, minibatches=4)
        with pytest.raises(ScheduleError, match=r"asynchronous.*pl\.train\(model_fn, plan, method="):
            to_torch_order(sch)
        with pytest.raises(ScheduleError, match="asynchronous"):   # before any process group is needed
            to_torch(pl.Plan.from_boundaries(14, [7]), sch, model, loss_fn=H.loss_fn)
    replicated = pl.Plan.from_boundaries(14, [7], [2, 1])
    with pytest.raises(ScheduleError, match=r"stage 0 is replicated on workers \[0, 1\].*FSDP.*straight"):
        to_torch(replicated, "1f1b-flush", model, loss_fn=H.loss_fn, microbatches=4)
    with pytest.raises(ScheduleError, match="replicated"):
        to_torch_order(pl.schedules.build("dp", pl.Plan.from_boundaries(14, [], [2]), microbatches=2))
    with pytest.raises(ScheduleError, match="no DualPipe, only DualPipeV: export method 'dualpipev'"):
        to_torch_order(pl.schedules.build("dualpipe", 2, microbatches=4))


def test_to_torch_needs_a_process_group_and_a_matching_plan():
    plan = pl.Plan.from_boundaries(14, [7])
    with pytest.raises(RuntimeError, match="torchrun.*init_process_group"):
        to_torch(plan, "1f1b-flush", H.pair(), loss_fn=H.loss_fn, microbatches=4)
    with pytest.raises(ScheduleError, match="schedule has 3 stages but the plan has 2"):
        to_torch(plan, pl.schedules.build("gpipe", 3, microbatches=3), H.pair(), loss_fn=H.loss_fn)
    with pytest.raises(ValueError, match="not microbatches=8"):
        to_torch(plan, pl.schedules.build("gpipe", plan, microbatches=4), H.pair(), loss_fn=H.loss_fn,
                 microbatches=8)


def test_stage_modules_of_a_v_schedule_compose_to_the_model():
    torch.manual_seed(0)
    model = H.pair()
    plan = pl.Plan.from_boundaries(14, [3, 7, 10])
    sch = from_torch("ZBVZeroBubble", workers=2, microbatches=4)
    mods = {**stage_modules(plan, sch, model, rank=0), **stage_modules(plan, sch, model, rank=1)}
    assert sorted(stage_modules(plan, sch, model, rank=0)) == [0, 3]      # the V: first and last on rank 0
    (x, img), _ = next(iter(H.pair_data()))
    vals: tuple = (x, img)
    for s in range(4):
        vals = mods[s](*vals)
    assert torch.allclose(vals, model(x, img), atol=1e-6)
    with pytest.raises(ValueError, match="plan is for a model of 14 layers but this model has 5"):
        stage_modules(plan, sch, H.mlp(), rank=0)


def test_one_rank_in_this_process_trains_as_plain_training_and_wraps_its_stage(tmp_path):
    """to_torch end to end without extra processes: a one-stage plan on a one-rank gloo group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = H.mlp()
        wrapped = []

        def wrap(stage, module):
            wrapped.append((stage, type(module).__name__))
            return module

        plan = pl.Plan.from_boundaries(5, [])
        pipe = to_torch(plan, "gpipe", model, loss_fn=H.loss_fn, microbatches=2, wrap=wrap)
        assert wrapped == [(0, "StageModule")] and sorted(pipe.stage_modules) == [0]
        assert isinstance(pipe, torch_api.require().PipelineScheduleMulti)
        opt = H.sgd(list(pipe.parameters()))
        data = iter(H.mlp_data())
        for _ in range(3):
            x, y = next(data)
            opt.zero_grad()
            pipe.step(x, target=y)
            opt.step()
        assert H.max_diff(pipe.local_state_dict(), H.reference_training(H.mlp, H.mlp_data, H.sgd, 3)) < 1e-5
        with pytest.raises(ValueError, match="schedule has 2 workers but the process group has 1 ranks"):
            to_torch(pl.Plan.from_boundaries(5, [2]), "gpipe", model, loss_fn=H.loss_fn, microbatches=2)
    finally:
        dist.destroy_process_group()


def test_a_compute_and_comms_order_imports_its_compute_actions(tmp_path):
    """torch's compute+comms CSV (``_dump_csv(format="compute_comms")``) also holds sends, receives and FSDP
    actions; pipelab derives transfers from the dataflow, so only the compute actions are kept."""
    path = tmp_path / "comms.csv"
    path.write_text("0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0REDUCE_GRAD,0RESHARD\n"
                    "1RECV_F0,1F0,1RECV_F1,1F1,1B0,1SEND_B0,1B1,1SEND_B1,1REDUCE_GRAD\n", encoding="utf-8")
    sch = from_torch(path)
    assert sch.actions == pl.schedules.build("gpipe", 2, microbatches=2, minibatches=1).actions


def test_a_tensor_parallel_plan_is_refused_by_name_before_any_process_group():
    plan = pl.Plan.from_boundaries(14, [7], tensor=2)
    with pytest.raises(ValueError, match=r"stage 0 has tensor degree 2 \(and 1 more stage\(s\)\), but the "
                                         r"torch bridge .*pl\.train / pl\.launch"):
        to_torch(plan, "1f1b-flush", H.pair(), loss_fn=H.loss_fn, microbatches=4)
    with pytest.raises(ValueError, match="stage 0 has tensor degree 2"):
        stage_modules(plan, pl.schedules.build("gpipe", plan, microbatches=2), H.pair(), rank=0)
