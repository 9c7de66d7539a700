"""PipeDream graph.txt import: every upstream file loads, totals and cuts match independent counts."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

import pipelab as pl
from pipelab.profile.pipedream_format import DATA_DIR, SHIPPED, load_pipedream, parse_graph, shipped

# the upstream files ship beside the project (../shared), not inside it: tests that need them skip
# cleanly where that folder is absent.  Not imported from conftest: two conftest modules exist
# (tests/ and tests/browser/) and which one "conftest" names depends on collection order.
SHARED_PROFILES = Path(__file__).resolve().parents[2] / "shared" / "data" / "pipedream-profiles"
ALL_FILES = sorted(p for p in SHARED_PROFILES.glob("*.txt") if not p.name.startswith("LICENSE"))
FIELD = re.compile(r"(forward_compute_time|backward_compute_time|activation_size|parameter_size)=([^,\s]+)")


def test_all_seventeen_upstream_files_load() -> None:
    if not SHARED_PROFILES.exists():
        pytest.skip("shared PipeDream profiles not present on this machine")
    assert len(ALL_FILES) == 17
    # the upstream MANIFEST's implied batch (Input activation / one 3x224x224 float32 image)
    implied = {row[0]: row[5] for row in (line.split("\t") for line in
               (SHARED_PROFILES / "MANIFEST.tsv").read_text().splitlines()) if len(row) > 5}
    for f in ALL_FILES:
        prof = pl.Profile.from_pipedream(f)
        n_nodes = sum(1 for line in f.read_text().splitlines() if line.startswith("node"))
        assert len(prof) == n_nodes, f.name
        assert all(a < b for a, b in prof.edges)
        if implied[f.name].isdigit():
            assert prof.batch_size == int(implied[f.name]), f.name


def test_vgg16_totals_equal_sums_of_the_file_fields() -> None:
    path = shipped("vgg16")
    sums = {"forward_compute_time": 0.0, "backward_compute_time": 0.0, "parameter_size": 0.0,
            "activation_size": 0.0}
    for line in path.read_text().splitlines():
        for k, v in FIELD.findall(line):
            sums[k] += float(v)
    prof = load_pipedream(path)
    assert prof.fwd_s == pytest.approx(sums["forward_compute_time"] / 1e3, rel=1e-12)
    assert prof.bwd_s == pytest.approx(sums["backward_compute_time"] / 1e3, rel=1e-12)
    assert prof.param_bytes == sums["parameter_size"]
    assert sum(layer.out_bytes for layer in prof.layers) == sums["activation_size"]
    # VGG-16 has 138,357,544 float32 parameters (Simonyan & Zisserman 2015, torchvision's count).
    assert prof.param_bytes == 4 * 138_357_544
    assert prof.batch_size == 128 and prof.input_bytes == 128 * 3 * 224 * 224 * 4
    # VGG is a chain apart from the flatten's Size node, so the first layers keep numeric order.
    assert prof.names[:5] == ("node1", "node2", "node3", "node4", "node5")


def _brute_cuts(path: Path) -> list[int]:
    """Cut bytes by brute force: for each boundary, the distinct producers with a crossing edge."""
    g = parse_graph(path.read_text())
    order = [n.node_id for n in g.topological_order()]
    pos = {v: i for i, v in enumerate(order)}
    act = {n.node_id: sum(n.activation_bytes) for n in g.nodes}
    cuts = []
    for i in range(len(order) - 1):
        crossing = {a for a, b in g.edges if pos[a] <= i < pos[b]}
        cuts.append(int(round(sum(act[a] for a in crossing))))
    return cuts


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_cut_bytes_match_brute_force_and_order_is_topological(name: str) -> None:
    path = shipped(name)
    prof = load_pipedream(path)
    assert list(prof.cut_bytes) == _brute_cuts(path)
    g = parse_graph(path.read_text())
    pos = {v: i for i, v in enumerate(prof.names)}
    assert all(pos[a] < pos[b] for a, b in g.edges)


def test_resnet50_skip_tensor_counted_once() -> None:
    prof = load_pipedream("resnet50")
    # Somewhere inside a residual block the cut carries the skip tensor beside the main path,
    # so it exceeds the output of the layer just before it.
    assert any(prof.cut_bytes[i] > prof.layers[i].out_bytes for i in range(len(prof) - 1))
    # Sending once: a fork node consumed twice after a cut is counted once (brute force agrees above),
    # and no cut exceeds the sum of all distinct outputs produced before it.
    assert all(
        prof.cut_bytes[i] <= sum(la.out_bytes for la in prof.layers[: i + 1]) for i in range(len(prof) - 1)
    )


def test_gnmt_batch_inferred_and_decoder_cuts_carry_encoder_output() -> None:
    g8 = load_pipedream("gnmt8")
    assert g8.batch_size == 32  # h_n of LSTM(2048, 1024) is 131072 B = 32 * 1024 * 4
    assert load_pipedream("gnmt16").batch_size == 128
    enc_out = g8.names.index("node19")  # last encoder Add, consumed by RecurrentAttention (node23)
    attn = g8.names.index("node23")
    for i in range(enc_out, attn):
        assert g8.cut_bytes[i] >= g8.layers[enc_out].out_bytes
    assert load_pipedream("gnmt8", batch_size=64).batch_size == 64


def test_shipped_copies_are_verbatim() -> None:
    rows = [line.split("\t") for line in (DATA_DIR / "MANIFEST.tsv").read_text().splitlines()
            if line and not line.startswith("#") and not line.startswith("name\t")]
    assert {r[0] for r in rows} == set(SHIPPED)
    for name, fname, _upstream, _batch, sha in rows:
        assert hashlib.sha1((DATA_DIR / fname).read_bytes()).hexdigest() == sha
        assert load_pipedream(name).batch_size == int(_batch)
    assert (DATA_DIR / "LICENSE-pipedream.txt").exists()
    assert pl.models.pipedream_profile("resnet50").model == "resnet50"


def test_bad_files_give_one_clear_error(tmp_path: Path) -> None:
    good = ("node1 -- Input -- forward_compute_time=1.0, backward_compute_time=0.0, activation_size=8.0, "
            "parameter_size=0.0\n")
    cases = {
        "negative": good.replace("1.0", "-1.0"),
        "garbage": "hello world\n",
        "json": '{"pipelab": "profile"}\n',
        "badnum": good.replace("8.0", "eight"),
        "unknown_edge": good + "\tnode1 -- node9\n",
        "empty": "\n",
    }
    expected = {"negative": "negative", "garbage": "cannot read", "json": "cannot read",
                "badnum": "not a number", "unknown_edge": "no node line", "empty": "no node lines"}
    for key, text in cases.items():
        f = tmp_path / f"{key}.txt"
        f.write_text(text)
        with pytest.raises(ValueError, match=expected[key]):
            load_pipedream(f)
    cyc = tmp_path / "cycle.txt"
    cyc.write_text(good + good.replace("node1", "node2") + "\tnode1 -- node2\n\tnode2 -- node1\n")
    with pytest.raises(ValueError, match="cycle"):
        load_pipedream(cyc)
    with pytest.raises(ValueError, match="no shipped PipeDream profile"):
        shipped("bert")
    with pytest.raises(FileNotFoundError, match="shipped names"):
        load_pipedream(tmp_path / "missing.txt")
