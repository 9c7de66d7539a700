"""The convergence report's time to accuracy (reproductions/convergence/report.py) against a hand count.

Two made-up seeds of DP and PipeDream accuracy curves at depth 2 and a one-row Table 1: the product is
the simulated speed-up times DP's epochs over PipeDream's to the target, interpolated between epochs,
computed here by hand; a seed on which PipeDream never gets there counts 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reproductions" / "convergence"))

import report  # noqa: E402


def _row(method: str, seed: int, curve: list[float], lr: float = 0.01) -> dict[str, object]:
    return {"task": "shapes", "stages": 2, "method": method, "lr": lr, "seed": seed, "commit": "abc",
            "final_accuracy": curve[-1], "curve": curve, "diverged": 0}


def test_time_to_accuracy_is_speedup_times_epoch_ratio(tmp_path: Path) -> None:
    t1 = tmp_path / "results.csv"
    t1.write_text("model,cluster,servers_x_gpus,config,stages,simulated_speedup,paper_speedup\n"
                  "vgg16,pipedream-a,4x4,15-1,2,4.0,5.28\n")
    rows = [_row("dp", 0, [0.5, 0.7]), _row("dp", 1, [0.45, 0.65]),
            _row("pipedream", 0, [0.4, 0.5, 0.8]), _row("pipedream", 1, [0.3, 0.4, 0.5])]
    out = report.time_to_accuracy(rows, t1, target=0.6)
    r = next(x for x in out if x["method"] == "pipedream" and x["step_size"] == "dp_step_size")
    dp0, dp1 = 1 + (0.6 - 0.5) / 0.2, 1 + (0.6 - 0.45) / 0.2          # 1.5 and 1.75 epochs
    pd0 = 2 + (0.6 - 0.5) / 0.3                                        # seed 1 never reaches 0.6
    assert r["seeds"] == 2 and r["seeds_reaching_target"] == 1
    assert r["stat_efficiency_max"] == pytest.approx(dp0 / pd0, abs=1e-3)
    assert r["stat_efficiency_min"] == 0.0
    assert r["time_to_accuracy_speedup_max"] == pytest.approx(4.0 * dp0 / pd0, abs=1e-3)
    assert r["dp_epochs_median"] == pytest.approx((dp0 + dp1) / 2, abs=0.01)
