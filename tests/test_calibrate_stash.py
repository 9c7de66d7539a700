"""The stashed forward's extra cost (issue 14): the runtime's ``Reparametrizer`` on a stashed weight
version costs more than the plain module call, per call and per parameter tensor. Oracles: the cost
model's closed form, the simulated trace of a stashing method against the same run without the term,
JSON round-trips (old files without the term load neutral). A host effect
(``Calibration.host_effects``), applied only where asked (``pipelab.sim.host_effects``)."""

from __future__ import annotations

import dataclasses
import json
import socket

import pytest

from pipelab.calibrate import probes
from pipelab.calibration import Calibration, HostEffects
from pipelab.cluster import Cluster
from pipelab.costs import CostModel
from pipelab.partition.plan import Plan
from pipelab.profile.records import Layer, Profile
from pipelab.schedules.actions import Action
from pipelab.sim.host_effects import HostCosts
from pipelab.sim.simulate import ProfileCosts, simulate

CALL, TENSOR = 9e-6, 3.5e-6


def _cal(**kw: object) -> Calibration:
    base: dict[str, object] = dict(
        host=socket.gethostname(), backend="gloo", device="cpu:test", date="2026-11-25T00:00:00+00:00",
        torch="2.14.1", cores=2, workers=2, p2p_latency_s=50e-6, p2p_bandwidth=2e9,
        allreduce_latency_s=80e-6, allreduce_bandwidth=1e9,
        overhead_s={"F": 1e-4, "B": 2e-4, "W": 3e-5, "U": 4e-4},
        optimizer_s={"sgd-momentum": (5e-5, 1e-10, 6e-6)},
        memory_bandwidth=1e10,
    )
    stash = kw.pop("stash_s", {"call": CALL, "tensor": TENSOR})
    base.update(kw)
    return Calibration(**base, host_effects=HostEffects(stash_s=stash))  # type: ignore[arg-type]


def _cluster(workers: int, **kw: object) -> Cluster:
    c = _cal(**kw)
    return dataclasses.replace(Cluster.flat(workers, bandwidth=c.p2p_bandwidth, latency=c.p2p_latency_s),
                               calibration=c)


def _profile(tensors: tuple[int, ...] = (2, 0, 4, 2)) -> Profile:
    layers = tuple(
        Layer(name=f"l{i}", kind="Linear", fwd_s=1e-3 * (i + 1), bwd_s=2e-3 * (i + 1), out_bytes=4096,
              param_bytes=40_000 * (i + 1), param_tensors=t)
        for i, t in enumerate(tensors)
    )
    return Profile(layers=layers, cut_bytes=(4096,) * (len(layers) - 1), batch_size=32)


def _costs(prof: Profile, cl: Cluster, ranges: list[tuple[int, int]], stashed: bool) -> HostCosts:
    assert cl.calibration is not None
    core = ProfileCosts(CostModel(prof, cl, optimizer="sgd-momentum"), ranges, 4)
    return HostCosts(core, cl.calibration.host_effects, stashed=stashed)


def test_a_stashed_forward_pays_per_call_and_per_tensor_and_the_backward_nothing() -> None:
    prof, cl = _profile(), _cluster(2)
    ranges = [(0, 1), (1, 3), (0, 4), (1, 2)]
    plain, stashed = _costs(prof, cl, ranges, False), _costs(prof, cl, ranges, True)
    for s, (a, b) in enumerate(ranges):
        n = sum(la.param_tensors or 0 for la in prof.layers[a:b])
        f, bw = Action(s, "F", 0), Action(s, "B", 0)
        assert stashed.compute(0, f, False) - plain.compute(0, f, False) == pytest.approx(CALL + TENSOR * n,
                                                                                          rel=1e-9)
        assert stashed.compute(0, bw, False) == plain.compute(0, bw, False) == \
            plain.core.compute(0, bw, False)


def test_stashing_methods_simulate_the_extra_on_every_forward_and_others_do_not() -> None:
    prof = _profile()
    plan = Plan.from_boundaries(len(prof), [2], batch_size=prof.batch_size)
    n = [2 + 0, 4 + 2]     # tensors of stage 0 and stage 1
    for method, extra, M in [("pipedream", True, 1), ("2bw", True, 4), ("gpipe", False, 4),
                             ("1f1b-flush", False, 4)]:
        runs = [simulate(plan, prof, _cluster(2, stash_s=s), method, microbatches=M, minibatches=8,
                         host_effects=True)
                for s in ({"call": CALL, "tensor": TENSOR}, {})]
        f = [{(e.stage, e.microbatch, e.step): e.end_s - e.start_s for e in r.trace.compute_events()
              if e.kind == "F"} for r in runs]
        assert f[0].keys() == f[1].keys()
        for (stage, m, step), d in f[0].items():
            want = CALL + TENSOR * n[stage] if extra else 0.0
            assert d - f[1][(stage, m, step)] == pytest.approx(want, abs=1e-12), (method, stage, m)


def test_the_probe_reports_each_depth_with_its_tensor_count() -> None:
    rows = probes.stashed_forward(2, depths=(1, 3), calls=8)
    assert sorted(n for n, _ in rows) == [2, 2, 6, 6]


def test_calibration_round_trips_the_stash_term_and_old_files_load_without_it() -> None:
    cal = _cal()
    again = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again == cal and again.host_effects.stashed_forward_s(10) == pytest.approx(CALL + 10 * TENSOR)
    assert "stashed forward" in again.describe()
    d = cal.to_dict()
    del d["host_effects"]["stash_s"]
    old = Calibration.from_dict(d)
    assert old.host_effects.stash_s == {} and old.host_effects.stashed_forward_s(10) == 0.0
    # a file from before HostEffects kept the terms at the top level: they load into the record
    older = {k: v for k, v in cal.to_dict().items() if k != "host_effects"}
    older["stash_s"] = {"call": CALL, "tensor": TENSOR}
    assert Calibration.from_dict(older).host_effects == dataclasses.replace(cal.host_effects, post_ahead=4)


# ---------------------------------------------------------------- a stashing U's new weight version
V_CALL, V_BYTE, V_TENSOR = 11e-6, 3e-11, 3.5e-6
VERSION = {"call": CALL, "tensor": TENSOR, "version_call": V_CALL, "version_byte": V_BYTE,
           "version_tensor": V_TENSOR}


def test_a_stashing_update_pays_the_new_versions_copy_and_others_do_not() -> None:
    prof, cl = _profile(), _cluster(2, stash_s=VERSION)
    ranges = [(0, 1), (1, 3), (0, 4)]
    plain, stashed = _costs(prof, cl, ranges, False), _costs(prof, cl, ranges, True)
    for s, (a, b) in enumerate(ranges):
        nbytes = sum(la.param_bytes for la in prof.layers[a:b])
        n = sum(la.param_tensors or 0 for la in prof.layers[a:b])
        u = Action(s, "U", 0)
        assert stashed.compute(0, u, False) - plain.compute(0, u, False) == pytest.approx(
            V_CALL + V_BYTE * nbytes + V_TENSOR * n, rel=1e-9)
    # a file from before the term: the same U as without stashing
    old = _costs(prof, _cluster(2), ranges, True)
    u = Action(2, "U", 0)
    assert old.compute(0, u, False) == pytest.approx(plain.compute(0, u, False), rel=1e-12)


def test_stashing_methods_simulate_the_new_version_at_every_update() -> None:
    prof = _profile()
    plan = Plan.from_boundaries(len(prof), [2], batch_size=prof.batch_size)
    nbytes = [sum(la.param_bytes for la in prof.layers[:2]), sum(la.param_bytes for la in prof.layers[2:])]
    tensors = [2, 6]
    for method, extra, M in [("pipedream", True, 1), ("2bw", True, 4), ("1f1b-flush", False, 4)]:
        runs = [simulate(plan, prof, _cluster(2, stash_s=s), method, microbatches=M, minibatches=8,
                         optimizer="sgd-momentum", host_effects=True)
                for s in (VERSION, {"call": CALL, "tensor": TENSOR})]
        u = [{(e.stage, e.microbatch, e.step): e.end_s - e.start_s for e in r.trace.compute_events()
              if e.kind == "U"} for r in runs]
        assert u[0].keys() == u[1].keys() and u[0]
        for (stage, m, step), d in u[0].items():
            want = V_CALL + V_BYTE * nbytes[stage] + V_TENSOR * tensors[stage] if extra else 0.0
            assert d - u[1][(stage, m, step)] == pytest.approx(want, abs=1e-12), (method, stage, m)


def test_the_new_version_probe_times_the_policys_copy_per_size_and_tensor_count() -> None:
    rows = probes.new_version([1 << 12, 1 << 16], 2, tensor_counts=(2, 8))
    assert sorted((n, k) for n, k, _ in rows) == [(4096, 2), (4096, 8), (65536, 2), (65536, 8)]
    assert all(t > 0 for _, _, t in rows)


def test_the_optimizer_probe_times_each_optimizer_per_size_and_tensor_count(monkeypatch) -> None:
    monkeypatch.setattr(probes, "EVICT_BYTES", 1 << 16)   # the cache eviction's size is not under test
    rows = probes.optimizer_steps([1 << 12, 1 << 16], 2, tensor_counts=(2, 8))
    assert set(rows) == set(probes.OPTIMIZERS)
    for got in rows.values():
        assert sorted((n, k) for n, k, _ in got) == [(4096, 2), (4096, 8), (65536, 2), (65536, 8)]
        assert all(t > 0 for _, _, t in got)


def test_the_eviction_between_steps_is_the_last_level_cache_read_from_sysfs(tmp_path) -> None:
    for name, level, size in (("index0", 1, "32K"), ("index2", 2, "1024K"), ("index3", 3, "32768K")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(f"{level}\n")
        (tmp_path / name / "size").write_text(f"{size}\n")
    assert probes.last_level_cache_bytes(sysfs=tmp_path) == 32 << 20
    (tmp_path / "index3" / "size").write_text("garbage\n")
    assert probes.last_level_cache_bytes(7, sysfs=tmp_path) == 7
    assert probes.last_level_cache_bytes(5, sysfs=tmp_path / "missing") == 5


def test_calibration_round_trips_the_version_terms_and_describes_them() -> None:
    cal = _cal(stash_s=VERSION)
    again = Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))).host_effects
    assert again.new_version_s(1000, 4) == pytest.approx(V_CALL + 1000 * V_BYTE + 4 * V_TENSOR)
    assert "a new version at U" in again.describe()
    assert _cal().host_effects.new_version_s(1000, 4) == 0.0            # a file with only the forward's terms


# ---------------------------------------------------------------- PipeMare's weight policy
D_CALL, D_BYTE, D_TENSOR = 7e-6, 5e-11, 4.5e-6
C_CALL, C_BYTE, C_TENSOR = 4e-6, 5.5e-11, 3.5e-6
PIPEMARE = {"call": CALL, "tensor": TENSOR, "delta_call": D_CALL, "delta_byte": D_BYTE,
            "delta_tensor": D_TENSOR, "correct_call": C_CALL, "correct_byte": C_BYTE,
            "correct_tensor": C_TENSOR}


def test_pipemare_simulates_its_weight_average_at_every_update_and_corrected_weights_in_backward() -> None:
    """Two stages: stage 0's forward and backward delays differ (1, 0), so its B builds corrected
    weights and recomputes through them; stage 1's (0, 0) do not; every U averages the change."""
    prof = _profile()
    plan = Plan.from_boundaries(len(prof), [2], batch_size=prof.batch_size)
    nbytes = [sum(la.param_bytes for la in prof.layers[:2]), sum(la.param_bytes for la in prof.layers[2:])]
    tensors = [2, 6]
    runs = [simulate(plan, prof, _cluster(2, stash_s=s), "pipemare", minibatches=8, optimizer="sgd-momentum",
                     host_effects=True) for s in (PIPEMARE, {})]
    dur = [{(e.stage, e.kind, e.microbatch): e.end_s - e.start_s for e in r.trace.compute_events()}
           for r in runs]
    assert dur[0].keys() == dur[1].keys()
    for (stage, kind, m), d in dur[0].items():
        extra = 0.0
        if kind == "U":
            extra = D_CALL + D_BYTE * nbytes[stage] + D_TENSOR * tensors[stage]
        elif kind == "B" and stage == 0:
            extra = C_CALL + C_BYTE * nbytes[0] + C_TENSOR * tensors[0] + CALL + TENSOR * tensors[0]
        assert d - dur[1][(stage, kind, m)] == pytest.approx(extra, abs=1e-12), (stage, kind, m)
    # another method on the same calibration pays none of it
    flush = [simulate(plan, prof, _cluster(2, stash_s=s), "1f1b-flush", microbatches=4, minibatches=4,
                      optimizer="sgd-momentum", host_effects=True).time_per_minibatch
             for s in (PIPEMARE, {"call": CALL, "tensor": TENSOR})]
    assert flush[0] == pytest.approx(flush[1], rel=1e-12)


def test_the_pipemare_probe_runs_the_policy_in_a_worker_like_process() -> None:
    rows = probes.in_worker("pipemare_policy", [1 << 12, 1 << 16], 2, (2, 8))
    assert sorted((n, k) for n, k, _, _ in rows) == [(4096, 2), (4096, 8), (65536, 2), (65536, 8)]
    assert all(u > 0 and b > 0 for _, _, u, b in rows)
    with pytest.raises(RuntimeError, match="calibration probe no_such_probe failed"):
        probes.in_worker("no_such_probe")


def test_calibration_round_trips_the_pipemare_terms_and_describes_them() -> None:
    again = Calibration.from_dict(json.loads(json.dumps(_cal(stash_s=PIPEMARE).to_dict()))).host_effects
    assert again.delta_average_s(1000, 4) == pytest.approx(D_CALL + 1000 * D_BYTE + 4 * D_TENSOR)
    assert again.corrected_weights_s(1000, 4) == pytest.approx(C_CALL + 1000 * C_BYTE + 4 * C_TENSOR)
    assert "PipeMare's U" in again.describe()
    bare = _cal().host_effects
    assert bare.delta_average_s(1000, 4) == 0.0 and bare.corrected_weights_s(1000, 4) == 0.0
