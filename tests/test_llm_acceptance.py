"""The blind acceptance script (reproductions/llm_acceptance) runs and writes its table; its error
bound is the reproduction's finding, not asserted here."""

from __future__ import annotations

from pathlib import Path

from reproductions.llm_acceptance.acceptance import load_rows, main


def test_published_rows_are_transcribed_with_their_source():
    rows = load_rows()
    assert {r.source.split(",")[0] for r in rows} == {"Narayanan et al. SC'21", "Korthikanti et al. 2022"}
    for r in rows:
        assert r.gpus % (r.tensor * r.pipeline) == 0 and r.layers % r.pipeline == 0
        assert (r.published_tflops_per_gpu is None) != (r.published_iteration_s is None)


def test_acceptance_script_prints_and_writes_its_table(tmp_path: Path, capsys):
    text = main(["--rows", "1.7B", "22B", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert text in out
    lines = [ln for ln in text.splitlines() if ln.startswith("| Narayanan") or ln.startswith("| Korthikanti")]
    assert [ln.split("|")[2].strip() for ln in lines] == ["1.7B", "22B"]
    assert "median |error|" in text
    assert (tmp_path / "results.md").read_text().strip() == text.strip()
    assert len((tmp_path / "results.csv").read_text().splitlines()) == 3
