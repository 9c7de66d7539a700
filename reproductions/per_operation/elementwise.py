"""The A100's two element-wise streaming rates, each from a published per-operation measurement.

pipelab prices element-wise work as bytes (its own count, :mod:`pipelab.llm.costs`) over a share of
HBM bandwidth. Two shares, both set here from measurements of the kernels Megatron-LM runs:

- ``attention_efficiency``, the unfused attention core's softmax and dropout over the ``a s^2 b``
  scores. Dao et al., "FlashAttention" (NeurIPS 2022, arXiv 2205.14135), Appendix E.6, times
  Megatron-LM's attention on one A100 40 GB (fp16, batch 16, 8 heads of dimension 64, Q, K and V given):
  at sequence 2,048 with dropout and no masking, forward 6.56 ms (Table 15), backward 10.80 ms (Table
  16), both 17.41 ms (Table 17). pipelab's roofline prices the core's batched matmuls (bound by the
  scores' bytes at the full HBM rate) and its softmax and dropout stream
  :data:`~pipelab.llm.costs.CORE_FORWARD_ELEMENTS` and :data:`~pipelab.llm.costs.CORE_BACKWARD_ELEMENTS`
  per score; the share is the one that makes forward + backward come out right, and each pass alone is
  the check.
- ``hbm_efficiency``, everything else (norms, dropout and residual adds, the activation function). The
  layer norm kernel Megatron-LM calls (apex's fused affine layer norm), timed on a GA100 in NVIDIA/apex
  pull request 1037 (batch 32 x sequence 512 x hidden 1024, fp16): forward 0.0751 ms, backward 0.1762
  ms. pipelab counts a norm's forward as one read and one write and its backward as many bytes again;
  the share is those bytes over forward + backward.

Shares of HBM are assumed to carry across A100 cards; FlashAttention's card is the 40 GB (1,555 GB/s),
and the pull request's "GA100" is taken to be the same card (the A100 40 GB, the one shipping when it
was written; with the 80 GB card's 2,039 GB/s the share would be 0.262, see the README).

Run: ``python -m reproductions.per_operation.elementwise``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelab.llm.costs import CORE_BACKWARD_ELEMENTS, CORE_FORWARD_ELEMENTS
from pipelab.llm.devices import DeviceRates
from pipelab.llm.shape import Transformer

#: A100 40 GB HBM2 bandwidth (NVIDIA A100 datasheet: 1,555 GB/s)
A100_40GB_HBM = 1555e9

#: FlashAttention's measured shape: batch, heads, head dimension, sequence (Appendix E.6)
BATCH, HEADS, HEAD_DIM, SEQ = 16, 8, 64, 2048
#: Megatron-LM's attention core with dropout, no masking, sequence 2,048, in seconds (Tables 15-17)
CORE_FORWARD_S, CORE_BACKWARD_S, CORE_BOTH_S = 6.56e-3, 10.80e-3, 17.41e-3

#: apex's fused affine layer norm on a GA100, fp16, rows x hidden (NVIDIA/apex pull request 1037)
NORM_ROWS, NORM_HIDDEN = 32 * 512, 1024
NORM_FORWARD_S, NORM_BACKWARD_S = 0.0751e-3, 0.1762e-3
#: a check from another source: PyTorch's own layer norm, forward + backward on an A100, fp16, the four
#: largest shapes (rows, hidden, seconds) of pytorch/pytorch pull request 87445's table
TORCH_NORM_FWD_BWD = ((8192, 2048, 235.2e-6), (8192, 3072, 346.7e-6), (6144, 4096, 389.8e-6),
                      (8192, 4096, 509.0e-6))


@dataclass(frozen=True)
class CoreFit:
    """The attention core's share of HBM and what the model then gives for each pass."""

    attention_efficiency: float
    matmul_forward_s: float
    forward_s: float
    backward_s: float

    @property
    def forward_error(self) -> float:
        """Predicted over measured forward, less one."""
        return self.forward_s / CORE_FORWARD_S - 1

    @property
    def backward_error(self) -> float:
        """Predicted over measured backward, less one."""
        return self.backward_s / CORE_BACKWARD_S - 1


def attention_core() -> CoreFit:
    """The attention core's streaming share that reproduces FlashAttention's Table 17."""
    rates = DeviceRates.of("a100").replace(hbm_bytes_per_s=A100_40GB_HBM)
    model = Transformer(name="flash-attention-benchmark", layers=1, hidden=HEADS * HEAD_DIM, heads=HEADS,
                        seq=SEQ, vocab=1, precision="fp16")
    e = model.bytes_per_element
    core = [mm for mm in model.matmuls(BATCH * SEQ) if not mm.weight]
    mm_f = sum(rates.matmul_s(mm.flops, mm.operand_bytes(e), "fp16") for mm in core)
    scores = BATCH * HEADS * SEQ * SEQ
    fwd_bytes, bwd_bytes = e * CORE_FORWARD_ELEMENTS * scores, e * CORE_BACKWARD_ELEMENTS * scores
    eff = (fwd_bytes + bwd_bytes) / ((CORE_BOTH_S - 3 * mm_f) * A100_40GB_HBM)
    rate = eff * A100_40GB_HBM
    return CoreFit(attention_efficiency=eff, matmul_forward_s=mm_f, forward_s=mm_f + fwd_bytes / rate,
                   backward_s=2 * mm_f + bwd_bytes / rate)


def counted_norm_rate(rows: int, hidden: int, seconds: float) -> float:
    """Bytes per second of a 16-bit layer norm's forward + backward under pipelab's count."""
    return 2 * (2 * 2 * rows * hidden) / seconds


def elementwise(hbm_bytes_per_s: float = A100_40GB_HBM) -> float:
    """The share of ``hbm_bytes_per_s`` at which apex's layer norm streams pipelab's count of its bytes
    (forward: read and write; backward: as many again) over its measured forward + backward."""
    return counted_norm_rate(NORM_ROWS, NORM_HIDDEN, NORM_FORWARD_S + NORM_BACKWARD_S) / hbm_bytes_per_s


def main() -> None:
    """Print both shares and the attention core's per-pass check."""
    f = attention_core()
    print(f"attention_efficiency = {f.attention_efficiency:.3f} of HBM (FlashAttention Table 17, "
          f"{CORE_BOTH_S * 1e3:.2f} ms)")
    print(f"  matmuls per forward {f.matmul_forward_s * 1e3:.2f} ms (roofline, bound by the scores' bytes)")
    print(f"  forward  {f.forward_s * 1e3:.2f} ms predicted, {CORE_FORWARD_S * 1e3:.2f} measured "
          f"({f.forward_error:+.1%})")
    print(f"  backward {f.backward_s * 1e3:.2f} ms predicted, {CORE_BACKWARD_S * 1e3:.2f} measured "
          f"({f.backward_error:+.1%})")
    print(f"hbm_efficiency = {elementwise():.3f} of HBM (apex layer norm, NVIDIA/apex#1037; "
          f"{elementwise(2039e9):.3f} if the card was the 80 GB A100)")
    apex = counted_norm_rate(NORM_ROWS, NORM_HIDDEN, NORM_FORWARD_S + NORM_BACKWARD_S)
    torch_rates = [counted_norm_rate(*row) for row in TORCH_NORM_FWD_BWD]
    print(f"  apex's layer norm streams {apex / 1e9:.0f} GB/s under pipelab's count; PyTorch's, timed in "
          f"pytorch/pytorch#87445: {', '.join(f'{r / 1e9:.0f}' for r in torch_rates)} GB/s")


if __name__ == "__main__":
    main()
