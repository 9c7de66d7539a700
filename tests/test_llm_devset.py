"""The development set (Zero Bubble, Qi et al. ICLR 2024; reproductions/zero_bubble) and the per-operation
measurements (reproductions/per_operation): devices.csv's A100 GEMM efficiency is the fit on Table 6,
its two element-wise shares are what the published kernel timings give, and pipelab's schedules on
Table 6's times sit between the bubble-only closed form and the measurement in every cell."""

from __future__ import annotations

import pytest

from pipelab.llm.devices import DeviceRates
from reproductions.per_operation import elementwise
from reproductions.zero_bubble import zero_bubble as zb


def test_devices_csv_holds_the_fit():
    fit = zb.fit_constants()
    a100 = DeviceRates.of("a100")
    assert a100.gemm_efficiency == pytest.approx(fit["gemm_efficiency"], abs=0.005)
    # T_F and T_B are not fitted: the analytic forward and backward stay within 20% of Table 6
    assert all(abs(e) < 0.2 for e in fit["forward_error"])
    assert all(abs(e) < 0.2 for e in fit["backward_input_error"])


def test_devices_csv_holds_the_per_operation_shares():
    a100 = DeviceRates.of("a100")
    core = elementwise.attention_core()
    assert a100.attention_efficiency == pytest.approx(core.attention_efficiency, abs=0.0005)
    assert a100.hbm_efficiency == pytest.approx(elementwise.elementwise(), abs=0.0005)
    # one share for both passes: each pass alone stays within 15% of FlashAttention's Tables 15 and 16
    assert abs(core.forward_error) < 0.15 and abs(core.backward_error) < 0.15


def test_attention_core_share_by_hand():
    """FlashAttention's Table 17 less two roofline passes of the core's matmuls, by hand."""
    scores = 16 * 8 * 2048 * 2048
    matmul_s = 2 * 2 * 16 * 8 * (2 * 2048 * 64 + 2048 * 2048) / 1555e9   # two bmm, fp16 bytes at HBM
    share = 2 * (4.5 + 5.5) * scores / ((17.41e-3 - 3 * matmul_s) * 1555e9)
    assert elementwise.attention_core().attention_efficiency == pytest.approx(share, rel=1e-9)


def test_schedules_on_table6_close_part_of_the_bubble_only_gap():
    rows = zb.predict(virtual=2)
    assert len(rows) == 48 and all("table6" in r for r in rows)
    for r in rows:
        measured, bubble, sim = r["measured"], r["bubble"], r["table6"]
        assert sim < bubble, r                  # bubbles alone overpredict; the schedule's sends recover part
        assert 0.02 < bubble / measured - 1 < 0.2, r
        if r["method"] != "ZB-2p":              # fixed orders: what they leave is overhead nobody models
            assert measured < sim, r
        else:                                   # the searched order is the greedy's, not the paper's run
            assert abs(sim / measured - 1) < 0.06, r


def test_another_layer_norm_timing_agrees_with_the_one_the_share_comes_from():
    """PyTorch's own layer norm (pytorch/pytorch#87445), timed apart from apex's, streams pipelab's count
    of a norm's bytes within 15% of apex's rate at each of its four largest shapes."""
    apex = elementwise.counted_norm_rate(elementwise.NORM_ROWS, elementwise.NORM_HIDDEN,
                                         elementwise.NORM_FORWARD_S + elementwise.NORM_BACKWARD_S)
    for rows, hidden, seconds in elementwise.TORCH_NORM_FWD_BWD:
        assert abs(elementwise.counted_norm_rate(rows, hidden, seconds) / apex - 1) < 0.15
