"""Partitioners on PipeDream's shipped profiles: the paper's shapes, the CLI, plan round-trip."""

import math

import pytest

from pipelab.cli.plan import main as plan_main
from pipelab.cluster import Cluster
from pipelab.partition import partition
from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile


@pytest.fixture(scope="module")
def vgg():
    return Profile.from_pipedream("vgg16")


def test_vgg16_cluster_a_picks_papers_15_1_without_memory_limit(vgg):
    # PipeDream SOSP'19 Table 1: VGG-16 on 4x4 V100 (cluster A) -> "15-1"
    plan = partition(vgg, "pipedream-a:4x4", memory_limit=math.inf)
    assert plan.config == "15-1"
    assert plan.speedup_over_dp > 1.0
    assert plan.stages[0].in_flight == 2 and plan.stages[1].in_flight == 1
    # the fully connected tail (most parameters) sits alone on the last worker
    assert vgg.totals(plan.stages[1].start, vgg.num_layers).param_bytes > 0.8 * vgg.param_bytes


def test_resnet50_prefers_data_parallel_without_memory_limit():
    # Table 1: ResNet-50 -> data parallel on A and B (small weights, large activations)
    prof = Profile.from_pipedream("resnet50")
    for spec in ("pipedream-a:4x4", "pipedream-b:2x8"):
        assert partition(prof, spec, memory_limit=math.inf).config == "16"


def test_gnmt8_straight_on_one_server_near_paper():
    # Table 1: GNMT-8 straight on A 1x4: 1.5x over DP
    prof = Profile.from_pipedream("gnmt8")
    plan = partition(prof, "pipedream-a:1x4", straight=True)
    assert plan.config == "straight" and 1.2 < plan.speedup_over_dp < 1.8


def test_every_method_gives_a_valid_plan(vgg):
    c = Cluster.parse("pipedream-a:1x4")
    for method, opts in (("pipedream", {}), ("prefix-sum", {}), ("gpipe", {"microbatches": 8}), ("dp", {})):
        plan = partition(vgg, c, method, memory_limit=math.inf, **opts)
        plan.validate(vgg)
        assert plan.time_per_minibatch > 0 and plan.num_workers == 4
        assert Plan.from_dict(plan.to_dict()) == plan


def test_cli_writes_plan(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert plan_main(["gnmt8", "--cluster", "pipedream-a:1x4", "--straight", "-o", str(out)]) == 0
    assert "straight" in capsys.readouterr().out
    plan = Plan.load(out)
    assert plan.config == "straight" and plan.num_workers == 4
    assert plan_main(["vgg16", "--cluster", "nowhere:2x2"]) == 2
    assert "unknown cluster preset" in capsys.readouterr().err
