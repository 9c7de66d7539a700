"""HetPipe's convergence reproduction (reproductions/hetpipe/convergence.py): the pieces its product rests on.

* The CPU profile of VGG-19 scaled to 224x224 and batch 32 has the sizes of that input, computed by hand
  (the input and the first convolution's output), and a 64x64 profile's layers scale their times by
  exactly their outputs' growth.
* Data parallelism of ResNet-152 at batch 32 on HetPipe's cluster does not fit its 6 and 8 GB GPUs, so
  the baseline uses the 8 TITANs (Horovod cannot train on a GPU that cannot hold the model).
* Epochs to a target, interpolated, against a closed form.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torchvision")

from reproductions.hetpipe import profiles  # noqa: E402
from reproductions.hetpipe.convergence import epochs_to  # noqa: E402
from reproductions.hetpipe.virtual_workers import dp_cluster  # noqa: E402


def test_vgg19_scaled_to_hetpipes_input_has_its_sizes() -> None:
    cpu = profiles.cpu_profile("vgg19")             # the committed JSON: no profiling here
    big = profiles.at_target(cpu, "vgg19")
    assert big.batch_size == 32
    assert big.input_bytes == 32 * 3 * 224 * 224 * 4
    assert big.layers[0].out_bytes == 32 * 64 * 224 * 224 * 4              # conv1_1: 64 channels, same size
    assert cpu.layers[0].out_bytes == cpu.batch_size * 64 * 64 * 64 * 4
    grow = (32 / cpu.batch_size) * (224 / 64) ** 2
    assert big.layers[0].fwd_s == pytest.approx(cpu.layers[0].fwd_s * grow)
    fc = next(i for i, x in enumerate(big.layers) if x.kind == "Linear")   # after the adaptive pool:
    # the classifier grows with the batch only
    assert big.layers[fc].fwd_s == pytest.approx(cpu.layers[fc].fwd_s * 32 / cpu.batch_size)
    assert big.param_bytes == cpu.param_bytes


def test_resnet152_data_parallelism_leaves_out_the_gpus_it_does_not_fit() -> None:
    import pipelab as pl

    prof = profiles.gpu_profile("resnet152")
    cl, note = dp_cluster(prof, pl.Cluster.preset("hetpipe"))
    assert cl.num_workers == 8
    assert {d.name for d in cl.devices} == {"TITAN-V", "TITAN-RTX"}
    assert "RTX-2060" in note and "Quadro-P4000" in note


def test_epochs_to_target_interpolates_from_chance() -> None:
    assert epochs_to([0.5, 0.7], 0.6) == pytest.approx(1.5)
    assert epochs_to([0.7], 0.6) == pytest.approx((0.6 - 0.25) / (0.7 - 0.25))
    assert epochs_to([float("nan"), 0.4, float("nan"), 0.8], 0.6) == pytest.approx(2 + 2 * 0.2 / 0.4)
    assert math.isinf(epochs_to([0.3, 0.5], 0.6))
