"""Tied parameters across real gloo processes: the tied GPT (and Hugging Face GPT-2's tied head) trained
by every synchronous method equals plain single-process training, and the copies stay bit-identical.

One test per process count loops over the methods (one launch each), to pay start-up costs few times.
"""

from __future__ import annotations

import pytest
import tie_helpers as H
import torch

import pipelab as pl
from pipelab.graph import layer_nodes, trace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _n() -> int:
    return len(layer_nodes(trace(H.tied_gpt())))


def _train(plan: pl.Plan, method: str, *, optimizer=H.sgd,  # type: ignore[no-untyped-def]
           microbatches=2, **options):
    return pl.train(H.tied_gpt, plan, method=method, data=H.data, loss_fn=H.loss_fn, optimizer=optimizer,
                    steps=H.STEPS, microbatches=microbatches, backend="gloo", progress=False, timeout=120,
                    **options)


def _check(res, want: dict[str, torch.Tensor]) -> float:  # type: ignore[no-untyped-def]
    st = res.state_dict()
    assert torch.equal(st["wte.weight"], st["head.weight"]), "the tied copies differ"
    d = H.distance(st, want)
    assert d < 1e-6, d
    return d


def test_tied_gpt_two_processes() -> None:
    ends, n = H.block_ends(), _n()
    want = H.plain()
    two = pl.Plan.from_boundaries(n, [ends[2]])
    for method in ("gpipe", "1f1b-flush", "zb-h1"):
        _check(_train(two, method), want)
    four = pl.Plan.from_boundaries(n, [ends[0], ends[2], ends[3]])      # 2 workers x 2 chunks
    _check(_train(four, "interleaved-1f1b", chunks=2), want)
    # PipeDream-2BW: every stage reads W(t - 1), so the tie holds; delayed SGD on the tied model
    _check(_train(two, "2bw", microbatches=2), H.delayed(delay=1))
    # Adam divides by the gradient's root mean square, so the rounding of M > 1 microbatch sums is
    # amplified (3e-3 after 3 steps, untied too); with M = 1 the pipeline equals it exactly
    _check(_train(two, "1f1b-flush", optimizer=H.adam, microbatches=1), H.plain(optimizer=H.adam))


def test_copies_bit_identical_after_every_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pipelab.runtime.checkpoint_files import list_checkpoints, load_worker

    ends, n = H.block_ends(), _n()
    plan = pl.Plan.from_boundaries(n, [ends[2]])
    _train(plan, "1f1b-flush", checkpoint_dir=str(tmp_path), checkpoint_every=1, checkpoint_keep=H.STEPS)
    steps = list_checkpoints(tmp_path)
    assert len(steps) == H.STEPS
    for k, path in enumerate(steps, start=1):      # each step's saved stage weights, from each process
        first = load_worker(path, 0, plan=plan, method="1f1b-flush")["stages"][0]["module"]
        last = load_worker(path, 1, plan=plan, method="1f1b-flush")["stages"][1]["module"]
        wte, head = first["graph_module.wte.weight"], last["graph_module.head.weight"]
        assert torch.equal(wte, head), f"copies differ after step {k}"
        assert float((wte - H.plain(steps=k)["wte.weight"]).abs().max()) < 1e-6


def test_tied_gpt_three_processes() -> None:
    ends, n = H.block_ends(), _n()
    want = H.plain()
    three = pl.Plan.from_boundaries(n, [ends[1], ends[3]])
    for method in ("gpipe", "1f1b-flush", "zb-h1"):
        _check(_train(three, method), want)
    six = pl.Plan.from_boundaries(n, ends)                             # 3 workers x 2 chunks
    _check(_train(six, "interleaved-1f1b", chunks=2, microbatches=3), want)
    # a hybrid: the first stage on two replicas; the tie's all-reduce covers both replicas and the head
    hybrid = pl.Plan.from_boundaries(n, [ends[2]], replicas=[2, 1])
    _check(_train(hybrid, "1f1b-flush"), want)


def test_hugging_face_gpt2_tied_head() -> None:
    from pipelab.runtime.job import TrainArgs, prepare
    from pipelab.runtime.launch import Run
    from pipelab.ties import find_ties

    gm = trace(H.hf_gpt2(), **H.HF_TRACE)
    n = len(layer_nodes(gm))
    (tie,) = find_ties(gm)
    assert tie.layers == (0, n - 1) or tie.layers[-1] == n - 1
    want = H.plain(H.hf_gpt2)
    plan = pl.Plan.from_boundaries(n, [n // 2])
    for method in ("1f1b-flush",):   # one launch: the other methods share the runtime path tested above
        job = prepare(TrainArgs(H.hf_gpt2, plan, H.data, H.loss_fn, H.sgd, H.STEPS, method=method,
                                microbatches=2, backend="gloo", timeout=120, trace_kwargs=H.HF_TRACE))
        res = Run(job).wait()
        st = res.state_dict()
        names = [k for k in st if k.endswith("wte.weight") or k.endswith("lm_head.weight")]
        assert len(names) == 2 and torch.equal(st[names[0]], st[names[1]])
        assert H.distance(st, want) < 1e-6


@pytest.mark.filterwarnings("ignore:the profile of GPT was measured on cpu")
@pytest.mark.parametrize("workers", [2, 3])
def test_partitioner_picked_cuts_on_the_full_trace(workers: int) -> None:
    """Issue 44's acceptance: the tied GPT traced op by op (its blocks read ``x.shape``, so shape integers
    block most boundaries) through ``pl.profile`` -> ``pl.partition`` -> ``pl.train`` on gloo, whatever
    legal boundaries the partitioner picks, equals plain SGD for every synchronous method."""
    x, _ = H.data()[0]
    prof = pl.profile(H.tied_gpt(), x, warmup=0, repeats=1, progress=False)
    assert prof.blocked_cuts, "the shape integers should block some boundaries"
    want = H.plain()
    plan = pl.partition(prof, f"flat:{workers}", "gpipe", stages=workers)
    assert plan.shared() and plan.shared()[0][1] == (0, workers - 1)
    for method in ("gpipe", "1f1b-flush", "zb-h1"):
        _check(_train(plan, method), want)
    virtual = pl.partition(prof, f"flat:{2 * workers}", "gpipe", stages=2 * workers)   # 2 chunks a worker
    _check(_train(virtual, "interleaved-1f1b", chunks=2, microbatches=workers), want)
