"""``reproductions/sim_accuracy/held_out.py``'s summary of the host-effect variants, on made-up rows
(no model runs here: the held-out models are used by that reproduction alone). Oracle: errors by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from pipelab.measured import HostEffects

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reproductions" / "sim_accuracy"))
import held_out  # noqa: E402


def _rows() -> pd.DataFrame:
    # two configurations, two rounds: measured 100 and 80 (median 90) and 200 twice; the core predicts
    # 99 and 260, "all" 90 and 200
    rows = []
    for r, (m1, m2) in enumerate([(100.0, 200.0), (80.0, 200.0)]):
        rows.append({"group": "held-out", "model": "a", "method": "gpipe", "microbatches": 4, "round": r,
                     "measured": m1, "pred_core": 99.0, "pred_all": 90.0})
        rows.append({"group": "held-out", "model": "a", "method": "pipedream", "microbatches": 1, "round": r,
                     "measured": m2, "pred_core": 260.0, "pred_all": 200.0})
    return pd.DataFrame(rows)


def test_each_configuration_scores_the_median_of_its_rounds_errors() -> None:
    got = held_out.summary(_rows()).set_index("variant")
    # core, gpipe: 99/100 - 1 = -0.01 and 99/80 - 1 = +0.2375, median +0.11375; pipedream 260/200 - 1 twice
    gpipe, pipedream = (-0.01 + 0.2375) / 2, 0.3
    assert got.loc["core", "median_abs_error"] == pytest.approx((gpipe + pipedream) / 2)
    assert got.loc["core", "worst_abs_error"] == pytest.approx(pipedream)
    # all, gpipe: -0.1 and +0.125, median +0.0125; pipedream exact
    assert got.loc["all", "median_abs_error"] == pytest.approx(0.0125 / 2)
    # per round: core's |errors| (0.01, 0.3) then (0.2375, 0.3): medians 0.155 and 0.26875
    assert got.loc["core", "round_median_lo"] == pytest.approx(0.155)
    assert got.loc["core", "round_median_hi"] == pytest.approx(0.26875)
    assert set(got["configs"]) == {2}
    # less the model's shift: core's two errors about their median
    shift = (gpipe + pipedream) / 2
    assert got.loc["core", "worst_abs_less_shift"] == pytest.approx((1 + pipedream) / (1 + shift) - 1)
    assert got.loc["core", "median_abs_less_shift"] == pytest.approx(
        ((1 - (1 + gpipe) / (1 + shift)) + ((1 + pipedream) / (1 + shift) - 1)) / 2)


def test_every_term_of_the_record_gets_its_left_out_variant() -> None:
    host = HostEffects(busy_sender_s=2e-4)
    got = held_out.variants(host)
    assert set(got) == {"core", "all", "without_busy_sender"}
    assert got["core"] is False and got["without_busy_sender"] == HostEffects()
    assert set(held_out.variants(HostEffects())) == {"core", "all"}     # neutral: no term to leave out
