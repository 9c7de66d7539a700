"""The blind acceptance script (reproductions/llm_acceptance) runs and writes its tables; its error
bounds are the reproduction's finding, not asserted here. The transcriptions are checked against the
figures as printed in the papers (copied here by hand from their text, independently of published.csv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reproductions.llm_acceptance.acceptance import load_rows, main
from reproductions.llm_acceptance.memory import load_memory_rows, predict_memory

#: Korthikanti et al. 2022, Table 5 (full recompute, present work, seconds) and Table 3 (micro batch)
KORTHIKANTI = {"22B": (1.42, 1.10, 4), "175B": (18.13, 13.75, 1), "530B": (49.05, 37.83, 1),
               "1T": (94.42, 71.49, 1)}
#: Narayanan et al. SC'21, Table 1: (heads, hidden, layers, t, p, GPUs, batch, teraFLOP/s per GPU)
NARAYANAN = {"1.7B": (24, 2304, 24, 1, 1, 32, 512, 137), "18B": (48, 6144, 40, 8, 1, 256, 1024, 135),
             "145B": (96, 12288, 80, 8, 8, 1536, 2304, 148), "1T": (160, 25600, 128, 8, 64, 3072, 3072, 163)}


def test_published_rows_are_transcribed_with_their_source():
    rows = load_rows()
    assert {r.source.split(",")[0] for r in rows} == {"Narayanan et al. SC'21", "Korthikanti et al. 2022"}
    for r in rows:
        assert r.gpus % (r.tensor * r.pipeline) == 0 and r.layers % r.pipeline == 0
        assert (r.published_tflops_per_gpu is None) != (r.published_iteration_s is None)


def test_transcriptions_match_the_papers_text():
    rows = {(r.source.split(",")[0], r.row): r for r in load_rows()}
    for name, (full, present, micro) in KORTHIKANTI.items():
        f, s = rows[("Korthikanti et al. 2022", name)], rows[("Korthikanti et al. 2022", f"{name}-sel")]
        assert (f.published_iteration_s, s.published_iteration_s) == (full, present)
        assert dict(f.stated)["microbatch_size"] == dict(s.stated)["microbatch_size"] == micro
        assert dict(f.stated).get("virtual", 1) == (3 if name in ("175B", "530B") else 1)
    assert rows[("Korthikanti et al. 2022", "530B-sel-dp8")].published_iteration_s == 39.15
    for name, (a, h, L, t, p, n, B, tf) in NARAYANAN.items():
        r = rows[("Narayanan et al. SC'21", name)]
        assert (r.heads, r.hidden, r.layers, r.tensor, r.pipeline, r.gpus, r.global_batch,
                r.published_tflops_per_gpu) == (a, h, L, t, p, n, B, tf)


def test_acceptance_script_prints_and_writes_its_tables(tmp_path: Path, capsys):
    text = main(["--rows", "1.7B", "22B", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert text in out
    lines = [ln for ln in text.splitlines() if ln.startswith("| Narayanan") or ln.startswith("| Korthikanti")]
    assert [ln.split("|")[2].strip() for ln in lines] == ["1.7B", "22B"]
    assert "median |error|" in text
    assert (tmp_path / "results.md").read_text().strip() == text.strip()
    assert len((tmp_path / "results.csv").read_text().splitlines()) == 3
    memory = (tmp_path / "memory.md").read_text()
    assert memory.strip() in out and "memory per GPU, reserved (the published quantity)" in memory


def test_memory_rows_compare_pipelab_with_the_published_figure():
    rows = load_memory_rows()
    assert rows and all(r["source"].startswith("torchtitan") and r["note"] for r in rows)
    r = predict_memory(rows[0], replay=False)
    parts = sum(v for k, v in r.items() if k.endswith("_gib") and k not in ("published_gib", "predicted_gib"))
    assert r["predicted_gib"] == pytest.approx(parts, rel=1e-9)
    assert r["error"] == pytest.approx(r["predicted_gib"] / r["published_gib"] - 1)
    # the 8- and 128-GPU FSDP rows differ only by the shards of the model states (16 B per parameter)
    a, b = predict_memory(rows[0], replay=False), predict_memory(rows[1], replay=False)
    params = 8_030_261_248
    assert a["predicted_gib"] - b["predicted_gib"] == pytest.approx(16 * params * (1 / 8 - 1 / 128) / 2**30,
                                                                    rel=1e-3)
