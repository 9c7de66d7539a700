"""Reserved memory: the caching-allocator replay on scenarios whose outcome follows from the allocator's
stated rules by hand, and the torchtitan step it replays (refusals, consistency with the closed forms,
and the meter's own count of the same trace)."""

from __future__ import annotations

import pytest

from pipelab.llm import Parallel, ParallelError, Transformer
from pipelab.llm.allocator import LARGE_PAGE, SMALL_PAGE, Segment, replay, round_size
from pipelab.llm.memory import stage_params

MiB = 2**20


def _events(*ops: tuple[str, str, float]) -> list[tuple[str, str, int, str]]:
    """("alloc" | "free", key, MiB) on the default stream, or with "@stream" after the key."""
    out = []
    for kind, key, mib in ops:
        name, _, stream = key.partition("@")
        out.append((kind, name, int(mib * MiB), stream or "default"))
    return out


def test_round_size():
    assert [round_size(n) for n in (1, 512, 513, 4096 + 1)] == [512, 512, 1024, 4608]


def test_pages_small_and_large():
    # two small requests share one 2 MiB page; a 30 MiB request maps two 20 MiB pages
    r = replay(_events(("alloc", "a", 0.5), ("alloc", "b", 0.5), ("alloc", "c", 30)))
    assert r.peak_reserved == SMALL_PAGE + 2 * LARGE_PAGE
    assert r.peak_allocated == 31 * MiB


def test_best_fit_reuses_a_hole_inside_the_segment():
    r = replay(_events(("alloc", "a", 100), ("alloc", "b", 50), ("alloc", "c", 110), ("free", "b", 50),
                       ("alloc", "d", 40)))
    assert r.peak_reserved == 260 * MiB            # 13 pages; d took b's hole
    assert r.peak_allocated == 260 * MiB


def test_a_hole_too_small_is_stranded_and_the_segment_grows():
    # a (100) freed leaves a hole b's neighbour cannot use for 150: the segment maps 160 more
    r = replay(_events(("alloc", "a", 100), ("alloc", "b", 100), ("free", "a", 100), ("alloc", "c", 150)))
    assert (r.peak_allocated, r.peak_reserved) == (250 * MiB, 360 * MiB)
    assert r.reserve_share == pytest.approx(360 / 250 - 1)


def test_the_free_end_grows_before_new_pages_are_mapped():
    # a 10 MiB free end plus one more page hold a 25 MiB request: 120 + 20 MiB, not 120 + 40
    seg = Segment(LARGE_PAGE)
    seg.malloc(100 * MiB)
    seg.malloc(10 * MiB)
    seg.free(100 * MiB)                                 # the 10 MiB block, now the free end
    assert seg.mapped == 120 * MiB
    assert seg.malloc(25 * MiB) == 100 * MiB
    assert seg.mapped == 140 * MiB


def test_a_block_inside_is_preferred_to_the_growable_end():
    seg = Segment(LARGE_PAGE)
    seg.malloc(100 * MiB)
    seg.malloc(10 * MiB)                               # mapped 120: a free end of 10 MiB
    seg.free(0)
    assert seg.malloc(5 * MiB) == 0                    # into the 100 MiB block, not the end
    assert seg.mapped == 120 * MiB


def test_freed_neighbours_merge():
    r = replay(_events(("alloc", "a", 100), ("alloc", "b", 100), ("free", "a", 100), ("free", "b", 100),
                       ("alloc", "c", 200)))
    assert r.peak_reserved == 200 * MiB


def test_streams_do_not_share_cached_memory():
    r = replay(_events(("alloc", "a@copy", 100), ("free", "a@copy", 100), ("alloc", "b", 100)))
    assert (r.peak_allocated, r.peak_reserved) == (100 * MiB, 200 * MiB)
    assert r.pools == {("copy", "large"): 100 * MiB, ("default", "large"): 100 * MiB}


def test_bad_events_are_refused_by_name():
    with pytest.raises(ValueError, match="free of 'x'"):
        replay(_events(("free", "x", 1)))
    with pytest.raises(ValueError, match="'resize' is not"):
        replay([("resize", "x", 1, "default")])


LLAMA = dict(name="tiny-llama", layers=2, hidden=64, heads=4, kv_heads=2, ffn=160, vocab=256, seq=32,
             tied=False, gated_mlp=True, bias=False, positions=False)


def test_refusals_name_each_setting():
    from pipelab.llm.reserved import reserved_memory

    m = Transformer(**LLAMA)
    with pytest.raises(ParallelError, match="pipeline=2") as e:
        reserved_memory(m, Parallel(pipeline=2, data=2, microbatches=4, sharding="zero1"))
    assert "sharding='zero1'" in str(e.value) and "microbatches=4" in str(e.value)
    with pytest.raises(ParallelError, match="without sequence_parallel"):
        reserved_memory(m, Parallel(tensor=2, sharding="fsdp", recompute="full"))
    with pytest.raises(ParallelError, match="selective-op' with tensor > 1"):
        reserved_memory(m, Parallel(tensor=2, sharding="fsdp", sequence_parallel=True,
                                    recompute="selective-op"))
    with pytest.raises(ParallelError, match="is not one"):
        reserved_memory(Transformer(name="gpt", layers=2, hidden=64, heads=4, seq=32, vocab=100),
                        Parallel(sharding="fsdp"))


@pytest.mark.parametrize("tensor", [1, 2])
def test_one_ranks_model_has_pipelabs_parameter_count(tensor):
    """The emulated rank's parameters equal pipelab's count for that device (tensor shards of the
    matrices and the vocabulary, replicated norms)."""
    from pipelab.llm.reserved import _Llama

    m = Transformer(**LLAMA)
    import torch

    with torch.device("meta"):
        net = _Llama(m, tensor, "full")
    assert sum(p.numel() for p in net.parameters()) == stage_params(m, Parallel(tensor=tensor), 0)


@pytest.mark.parametrize("par", [
    Parallel(data=4, microbatch_size=2, recompute="selective-op", sharding="fsdp"),
    Parallel(tensor=2, data=2, microbatch_size=2, recompute="full", sequence_parallel=True, sharding="fsdp"),
])
def test_replay_of_a_small_step(par):
    """Reserved is at least allocated; the replay's allocated peak is the meter's (to 512-byte
    rounding); after the first step (AdamW's moments appear at its end) the steps repeat exactly."""
    from pipelab.llm.reserved import reserved_memory

    r = reserved_memory(Transformer(**LLAMA), par, steps=3)
    assert r.peak_reserved >= r.peak_allocated >= max(r.step_peaks)
    assert r.peak_allocated - max(r.step_peaks) < 512 * 2000
    assert r.step_peaks[1] == r.step_peaks[2] > r.step_peaks[0]
    assert "torch.compile" in r.describe()


@pytest.mark.parametrize("par", [
    Parallel(data=8, microbatch_size=2, recompute="selective-op", sharding="fsdp"),
    Parallel(tensor=2, data=4, microbatch_size=2, recompute="full", sequence_parallel=True, sharding="fsdp"),
])
def test_the_recorded_step_agrees_with_the_closed_form(par):
    """Two descriptions written apart, one by counting terms (memory_per_device) and one by running the
    step's code on the meta device, agree on the allocated peak of a loss-dominated Llama once the two
    facts of timing that a sum of parts cannot see are applied: at the loss's backward no sharded
    gradient exists yet (zero_grad set them to none), and what FSDP holds gathered is the root (embedding,
    final norm, head) and the last block in bf16, not two blocks with their gradients."""
    from pipelab.llm import memory_per_device
    from pipelab.llm.memory import block_shard_params
    from pipelab.llm.reserved import reserved_memory

    m = Transformer(name="llama-ish", layers=4, hidden=512, heads=8, kv_heads=2, ffn=1536, vocab=32000,
                    seq=512, tied=False, gated_mlp=True, bias=False, positions=False)
    t = par.tensor
    closed = memory_per_device(m, par, recipe="fp32-adam-bf16-compute", attention="flash", loss="upcast",
                               kernels="eager", sequence_parallel_inputs="gathered")[0]
    root = 2 * m.vocab * m.hidden // t + m.hidden
    at_the_loss = closed.total - closed.gradients - closed.gathered + 2 * (root + block_shard_params(m, t))
    recorded = max(reserved_memory(m, par, steps=2).step_peaks)
    assert recorded == pytest.approx(at_the_loss, rel=1e-6)


def test_fsdp_emulation_reduces_each_block_after_its_backward_then_the_root(monkeypatch):
    """FSDP2's order: a block's reduce-scatter once its input's gradient exists (last block first), the
    root's (embedding, norm, head) when the backward ends; the previous block is gathered (prefetched)
    before the next reduce."""
    import pipelab.llm.reserved as reserved

    seen: list[str] = []
    unshard, post = reserved._Fsdp.unshard, reserved._Fsdp.post_backward
    monkeypatch.setattr(reserved._Fsdp, "post_backward", lambda self, u: (seen.append(f"reduce {u}"),
                                                                        post(self, u))[1])
    monkeypatch.setattr(reserved._Fsdp, "unshard", lambda self, u: (
        seen.append(f"gather {u}") if u not in self.gathered else None, unshard(self, u))[1])
    m = Transformer(**{**LLAMA, "layers": 3})
    reserved.reserved_memory(m, Parallel(data=2, recompute="full", sharding="fsdp"), steps=1)
    backward = seen[seen.index("reduce layers.2") - 1:]
    assert backward == ["gather layers.1", "reduce layers.2", "gather layers.0", "reduce layers.1",
                        "reduce layers.0", "reduce root"]
