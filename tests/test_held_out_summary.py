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


def test_each_variant_is_scored_against_the_median_of_the_rounds() -> None:
    got = held_out.summary(_rows()).set_index("variant")
    assert got.loc["core", "median_abs_error"] == pytest.approx((0.1 + 0.3) / 2)   # 99/90 - 1, 260/200 - 1
    assert got.loc["core", "worst_abs_error"] == pytest.approx(0.3)
    assert got.loc["all", "median_abs_error"] == pytest.approx(0.0)
    # per round: core's |errors| (0.01, 0.3) then (0.2375, 0.3): medians 0.155 and 0.26875
    assert got.loc["core", "round_median_lo"] == pytest.approx(0.155)
    assert got.loc["core", "round_median_hi"] == pytest.approx(0.26875)
    assert set(got["configs"]) == {2}
    # less the model's shift: core's errors +0.1 and +0.3 about their median +0.2
    assert got.loc["core", "worst_abs_less_shift"] == pytest.approx(1.3 / 1.2 - 1)
    assert got.loc["core", "median_abs_less_shift"] == pytest.approx(((1 - 1.1 / 1.2) + (1.3 / 1.2 - 1)) / 2)


def test_every_term_of_the_record_gets_its_left_out_variant() -> None:
    host = HostEffects(cross_s=1e-3, busy_sender_s=2e-4)
    got = held_out.variants(host)
    assert set(got) == {"core", "all", "without_cross", "without_busy_sender"}
    assert got["core"] is False and got["without_cross"] == HostEffects(busy_sender_s=2e-4)
