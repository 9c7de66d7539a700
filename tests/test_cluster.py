"""Cluster record: hierarchy arithmetic, presets, parsing, errors, round-trip."""

import pytest

from pipelab.cluster import Cluster, Device, Level


def test_level_between_and_link_follow_blocks():
    c = Cluster.preset("pipedream-a", servers=4, gpus_per_server=4)
    assert c.num_workers == 16
    assert c.level_between(5, 5) == -1
    assert c.level_between(4, 7) == 0          # same server
    assert c.level_between(3, 4) == 1          # neighbours across servers
    assert c.link(0, 15).name.startswith("ethernet")
    assert c.link(8, 9).name == "pcie"
    assert c.link(0, 15).bandwidth == pytest.approx(10e9 / 8)   # 10 Gbps
    with pytest.raises(ValueError, match="itself"):
        c.link(2, 2)
    with pytest.raises(ValueError, match="outside"):
        c.speed(16)


@pytest.mark.parametrize("spec,servers,gpus", [("pipedream-a:4x4", 4, 4), ("pipedream-a:1x4", 1, 4),
                                               ("pipedream-b:2x8", 2, 8), ("pipedream-c:8", 8, 1),
                                               ("pipedream-a:3", 1, 3), ("pipedream-b:16", 2, 8),
                                               ("dgx-h100:4x8", 4, 8)])
def test_parse_specs(spec, servers, gpus):
    c = Cluster.parse(spec)
    assert c.num_workers == servers * gpus
    assert c.levels[-1].size == servers
    if gpus > 1:
        assert c.levels[0].size == gpus


def test_presets_carry_paper_numbers():
    b = Cluster.preset("pipedream-b")
    assert b.num_workers == 16 and b.levels[1].bandwidth == pytest.approx(25e9 / 8)
    assert b.memory(0) == 16 * 2**30
    c = Cluster.preset("pipedream-c", servers=3)
    assert len(c.levels) == 1 and c.levels[0].bandwidth == pytest.approx(40e9 / 8)
    assert c.memory(0) == 12 * 2**30
    h = Cluster.preset("dgx-h100", servers=2)
    assert h.levels[0].bandwidth == pytest.approx(450e9) and h.levels[1].uplinks == 8
    het = Cluster.preset("hetpipe")
    assert het.num_workers == 16 and not het.homogeneous
    assert {d.name for d in het.devices} == {"TITAN-V", "TITAN-RTX", "RTX-2060", "Quadro-P4000"}
    assert "GB/s" in b.describe()
    assert "pipedream-a" in Cluster.presets() and "hetpipe" in Cluster.presets()


def test_bad_input_errors_say_what_to_do():
    with pytest.raises(ValueError, match="unknown cluster preset"):
        Cluster.preset("nope")
    with pytest.raises(ValueError, match="at least one worker"):
        Cluster.flat(0)
    with pytest.raises(ValueError, match="multiply to 6"):
        Cluster("x", (Level("a", 2, 1e9), Level("b", 3, 1e9)), (Device("g"),) * 5)
    with pytest.raises(ValueError, match="zero workers"):
        Cluster("x", (Level("a", 1, 1e9),), ())
    with pytest.raises(ValueError, match="bandwidth"):
        Level("a", 2, float("nan"))
    with pytest.raises(ValueError, match="speed"):
        Device("g", speed=-1.0)
    with pytest.raises(ValueError, match="cannot read"):
        Cluster.parse("pipedream-a:4x4x4")
    with pytest.raises(ValueError, match="fill servers"):
        Cluster.parse("pipedream-a:6")


def test_round_trip_and_subset():
    c = Cluster.hetpipe()
    assert Cluster.from_dict(c.to_dict()) == c
    a = Cluster.preset("pipedream-a", servers=4, gpus_per_server=4)
    s = a.subset([4, 5, 6, 7, 8, 9, 10, 11])     # two whole servers
    assert [lv.size for lv in s.levels] == [4, 2]
    s1 = a.subset([0, 1, 2])                       # inside one server
    assert s1.num_workers == 3 and s1.link(0, 2).name == "pcie"
    with pytest.raises(ValueError, match="regular"):
        a.subset([0, 1, 4])
