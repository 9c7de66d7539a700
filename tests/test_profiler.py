"""The profiler against oracles: parameter counts of the papers, layers that sleep known times,
the whole model's measured forward time, stage modules' real outputs, closed-form FLOPs and bytes."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest
import torch
from timing import holds_or_skip
from torch import nn

import pipelab as pl
from pipelab.costs import CostModel
from pipelab.graph import build_stage, tensor_bytes, trace
from pipelab.hostload import HostLoadSampler
from pipelab.models import gnmt, gnmt_param_count, mlp, resnet50, synthetic_translation, vgg16


def test_vgg16_and_resnet50_parameter_bytes_are_exact() -> None:
    # Parameter bytes do not depend on the image size, so a small image keeps this fast; nor on the
    # small-batch pass (fixed parts) or the whole-model timing, which would time everything again.
    quick = {"warmup": 0, "repeats": 1, "progress": False, "small_batch": None, "whole": False}
    pv = pl.profile(vgg16(), torch.randn(1, 3, 32, 32), **quick)
    assert pv.param_bytes == 4 * 138_357_544
    pr = pl.profile(resnet50(), torch.randn(2, 3, 32, 32), **quick)
    assert pr.param_bytes == 4 * 25_557_032
    assert pr.batch_size == 2 and pr.input_bytes == 2 * 3 * 32 * 32 * 4
    assert len(pr) == len(pr.cut_bytes) + 1 and all(a < b for a, b in pr.edges)


def test_resnet_cut_inside_a_block_carries_the_skip_tensor() -> None:
    prof = pl.profile(resnet50(), torch.randn(2, 3, 32, 32), warmup=0, repeats=1, progress=False)
    i = prof.names.index("layer1.0.conv1")
    block_input = prof.layers[prof.names.index("maxpool")].out_bytes
    # The cut after the block's first conv carries the conv's output *and* the block input
    # that the residual addition (via the downsample branch) still needs.
    assert prof.cut_bytes[i] == prof.layers[i].out_bytes + block_input
    assert prof.cut_bytes[i] > prof.layers[i].out_bytes


def test_gnmt_decoder_cuts_carry_encoder_outputs_and_params_match_formula() -> None:
    model = gnmt(8, vocab=100, hidden=32).eval()
    src, tgt_in, _ = synthetic_translation(4, vocab=100, src_len=6)
    prof = pl.profile(model, (src, tgt_in), warmup=0, repeats=1, progress=False)
    assert prof.param_bytes == 4 * gnmt_param_count(8, 100, 32)
    enc_out = prof.names.index("add_1")       # last encoder residual add (4 encoder layers)
    keys_used = prof.names.index("bmm")       # the attention context reads the encoder outputs
    enc_bytes = prof.layers[enc_out].out_bytes
    assert enc_bytes == 4 * 6 * 32 * 4
    assert prof.names.index("embed_tgt") > enc_out  # decoder layers come after the encoder output
    for i in range(enc_out, keys_used):
        assert prof.cut_bytes[i] >= enc_bytes, prof.names[i]


@pytest.mark.parametrize("seed", [0, 1])
def test_cut_bytes_equal_what_a_stage_really_sends(seed: int) -> None:
    model = resnet50().eval()
    x = torch.randn(2, 3, 32, 32)
    gm = trace(model)
    prof = pl.profile(model, x, warmup=0, repeats=1, progress=False)
    cut = torch.Generator().manual_seed(seed)
    i = int(torch.randint(1, len(prof) - 1, (1,), generator=cut))
    with torch.no_grad():
        sent = build_stage(gm, 0, i + 1)(x)
    assert tensor_bytes(sent) == prof.cut_bytes[i]


def test_flops_and_saved_bytes_closed_forms() -> None:
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 8))
    prof = pl.profile(model, torch.randn(16, 64), warmup=0, repeats=1, progress=False)
    assert [layer.flops for layer in prof.layers] == [2 * 16 * 64 * 32, 0, 2 * 16 * 32 * 8]
    # Weights are not counted: a Linear keeps its input (for the weight gradient), tanh its output.
    # Each saved value counts once, at the layer that produces it: the model's input (saved by the
    # first Linear) is input_bytes; tanh's output (saved by tanh and by the second Linear: one
    # storage) counts at tanh; the first Linear's output is saved by nobody.
    assert prof.layers[0].saved_bytes == 0
    assert prof.layers[1].saved_bytes == 16 * 32 * 4
    assert prof.layers[2].saved_bytes == 0
    assert prof.input_bytes == 16 * 64 * 4
    assert [layer.out_bytes for layer in prof.layers] == [16 * 32 * 4, 16 * 32 * 4, 16 * 8 * 4]
    assert [layer.param_bytes for layer in prof.layers] == [(64 * 32 + 32) * 4, 0, (32 * 8 + 8) * 4]
    assert prof.edges == ((0, 1), (1, 2))
    # LSTM FLOPs (fused kernel, not seen by the flop counter): 2 * 4H(in+H) per token and direction
    lstm = pl.profile(
        nn.Sequential(nn.LSTM(6, 5, bidirectional=True, batch_first=True)),
        torch.randn(3, 7, 6),
        warmup=0,
        repeats=1,
        progress=False,
    )
    assert lstm.layers[0].flops == 3 * 7 * 2 * (2 * 4 * 5 * (6 + 5))


class _SleepBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor, seconds: float) -> torch.Tensor:  # type: ignore[override]
        ctx.seconds = seconds  # type: ignore[attr-defined]
        return x.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        time.sleep(ctx.seconds)  # type: ignore[attr-defined]
        return grad, None


class Sleep(nn.Module):
    """A layer whose forward sleeps ``fwd`` seconds and whose backward sleeps ``bwd`` seconds
    (per sample of its batch with ``per_sample=True``)."""

    def __init__(self, fwd: float, bwd: float, per_sample: bool = False) -> None:
        super().__init__()
        self.fwd, self.bwd, self.per_sample = fwd, bwd, per_sample
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0] if self.per_sample else 1
        time.sleep(self.fwd * n)
        return _SleepBackward.apply(x * self.scale, self.bwd * n)


def test_layers_that_sleep_known_times_are_timed_within_a_few_ms() -> None:
    model = nn.Sequential(Sleep(0.02, 0.03), Sleep(0.01, 0.005))
    expected = [(0.02, 0.03), (0.01, 0.005)]
    with HostLoadSampler() as load:
        for _attempt in range(2):  # a loaded machine can wake a sleeper late: one retry
            prof = pl.profile(model, torch.randn(4, 3), leaf_modules=[Sleep], warmup=0, repeats=5,
                              progress=False)
            assert [layer.kind for layer in prof.layers] == ["Sleep", "Sleep"]
            # sleeping never ends early, so the lower bounds are exact; the upper bounds allow 5 ms
            for layer, (f, b) in zip(prof.layers, expected):
                assert layer.fwd_s >= f and layer.bwd_s >= b, layer
            late = [(layer.fwd_s - f, layer.bwd_s - b) for layer, (f, b) in zip(prof.layers, expected)]
            if max(max(d) for d in late) < 0.005:
                break
    holds_or_skip(max(max(d) for d in late) < 0.005, load.result, f"sleepers woke over 5 ms late: {late}")


def test_small_batch_finds_the_fixed_part_of_each_layer() -> None:
    """A layer that sleeps the same whatever the batch is all fixed; one that sleeps per sample has
    no fixed part; the cost model then prices a microbatch of 2 of the 8 samples affinely."""
    model = nn.Sequential(Sleep(0.02, 0.01), Sleep(0.004, 0.002, per_sample=True))
    with HostLoadSampler() as load:
        for _attempt in range(2):  # a loaded machine can wake a sleeper late: one retry
            prof = pl.profile(model, torch.randn(8, 3), leaf_modules=[Sleep], warmup=0, repeats=3,
                              progress=False, small_batch=2)
            fixed, per_sample = prof.layers
            # the fit (t_small * 8 - t_full * 2) / 6 turns a late wake-up of d into at most 4/3 d
            errs = [abs(fixed.fwd_fixed_s - fixed.fwd_s), abs(fixed.bwd_fixed_s - fixed.bwd_s),
                    per_sample.fwd_fixed_s, per_sample.bwd_fixed_s]
            if max(errs) < 0.007:
                break
    assert fixed.fwd_s >= 0.02 and per_sample.fwd_s >= 8 * 0.004
    cm = CostModel(prof, pl.Cluster.flat(1, bandwidth=1e9))
    f, b = cm.compute_s(0, 2, 0, microbatches=4)
    assert f == pytest.approx(fixed.fwd_fixed_s + (fixed.fwd_s - fixed.fwd_fixed_s) / 4
                              + per_sample.fwd_fixed_s + (per_sample.fwd_s - per_sample.fwd_fixed_s) / 4)
    assert f > 0.02 + 0.004 * 2 * 0.8     # not a quarter of the sleeper's 20 ms
    with pytest.raises(ValueError, match="small_batch=8 must be an integer in 1..7"):
        pl.profile(model, torch.randn(8, 3), leaf_modules=[Sleep], small_batch=8, progress=False)
    y = torch.zeros(8)
    with pytest.raises(
        ValueError, match="small_batch=2: the model .or loss_fn. failed on the first 2 samples"
    ):
        pl.profile(nn.Sequential(nn.Linear(3, 1)), torch.randn(8, 3), small_batch=2, progress=False,
                   loss_fn=lambda out: ((out.squeeze(1) - y) ** 2).mean())
    holds_or_skip(max(errs) < 0.007, load.result, f"fixed parts off by over 7 ms: {errs}")


def _whole_forward(model: nn.Module, x: torch.Tensor, n: int = 9) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        model(x)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def test_sum_of_layer_forward_times_matches_whole_model_forward() -> None:
    torch.manual_seed(0)
    model = mlp(512, 1024, 6, 10)
    x = torch.randn(256, 512)
    ratios = []
    with HostLoadSampler() as load:
        for _ in range(3):  # the machine is shared and noisy: retries
            before = _whole_forward(model, x)
            prof = pl.profile(model, x, warmup=1, repeats=5, progress=False)
            whole = statistics.median([before, _whole_forward(model, x)])
            ratios.append(prof.fwd_s / whole)
            if abs(ratios[-1] - 1) <= 0.25:
                break
    holds_or_skip(abs(ratios[-1] - 1) <= 0.25, load.result,
                  f"sum of layer forwards / whole forward: {ratios}, outside 1 ± 0.25")


def test_loss_fn_adds_its_cost_to_the_last_layer() -> None:
    model = nn.Sequential(nn.Linear(8, 4))
    x = torch.randn(2, 8)

    def slow_loss(out: torch.Tensor) -> torch.Tensor:
        time.sleep(0.01)
        return out.sum()

    prof = pl.profile(model, x, loss_fn=slow_loss, warmup=0, repeats=1, progress=False)
    assert prof.layers[-1].fwd_s >= 0.01


def test_profiling_leaves_model_state_alone() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pl.profile(model, torch.randn(2, 3, 8, 8), warmup=1, repeats=2, progress=False)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # fx cannot trace control flow on tensor values
            return self.lin(x)
        return x


def test_bad_inputs_give_one_clear_error() -> None:
    with pytest.raises(TypeError, match="leaf_modules"):
        pl.profile(_DataDependent(), torch.randn(2, 4), progress=False)
    with pytest.raises(ValueError, match=r"sample input \(\(2, 5\) float32\) does not fit"):
        pl.profile(mlp(4, 8, 2, 2), torch.randn(2, 5), progress=False)
    with pytest.raises(ValueError, match="repeats"):
        pl.profile(mlp(4, 8, 2, 2), torch.randn(2, 4), repeats=0, progress=False)
    with pytest.raises(TypeError, match="sample_input"):
        pl.profile(mlp(4, 8, 2, 2), {"x": torch.randn(2, 4)}, progress=False)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            pl.profile(mlp(4, 8, 2, 2), torch.randn(2, 4), device="cuda", progress=False)


def test_saved_profile_round_trips(tmp_path: Path) -> None:
    import pipelab.profile  # importing the subpackage rebinds pl.profile to it; it must stay callable

    assert callable(pipelab.profile)
    with torch.no_grad():  # the profiler turns autograd on for itself
        prof = pl.profile(
            mlp(8, 16, 3, 2), torch.randn(4, 8), warmup=0, repeats=1, progress=False, model_name="m"
        )
        assert not torch.is_grad_enabled()  # and the caller's mode is restored
    assert prof.bwd_s > 0
    path = prof.save(tmp_path / "m.json")
    back = pl.Profile.load(path)
    assert back == prof
    assert json.loads(path.read_text())["pipelab"] == "profile"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_profile_matches_cpu_structure() -> None:
    model = resnet50()
    x = torch.randn(2, 3, 32, 32)
    cpu = pl.profile(model, x, warmup=0, repeats=1, progress=False)
    gpu = pl.profile(model, x, device="cuda", warmup=1, repeats=3, progress=False)
    assert gpu.device.startswith("cuda") and gpu.fingerprint() == cpu.fingerprint()
    assert gpu.cut_bytes == cpu.cut_bytes and gpu.fwd_s > 0
