"""pipelab.llm against closed forms written here independently: torch's parameter count of real
Hugging Face models of the same shape, Narayanan et al.'s FLOP formula, Korthikanti et al.'s
activation equations, the divisibility refusals, and a measured profile's per-layer FLOP split."""

from __future__ import annotations

import pytest
import torch

from pipelab.cluster import Cluster
from pipelab.llm import (
    Parallel,
    ParallelError,
    Transformer,
    in_flight,
    layer_activation_bytes,
    memory_per_device,
    stage_costs,
    transformer_profile,
)
from pipelab.llm.devices import DeviceRates, device_table, sources


def _hf(kind: str):
    transformers = pytest.importorskip("transformers")
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=3, n_embd=64, n_head=4, n_positions=32, vocab_size=101)
        return cfg, transformers.GPT2LMHeadModel(cfg)
    if kind == "mistral":
        cfg = transformers.MistralConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                         num_key_value_heads=1, intermediate_size=80, vocab_size=61,
                                         max_position_embeddings=32, tie_word_embeddings=True)
        return cfg, transformers.MistralForCausalLM(cfg)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=8,
                                   num_key_value_heads=2, intermediate_size=96, vocab_size=97,
                                   max_position_embeddings=32, tie_word_embeddings=False)
    return cfg, transformers.LlamaForCausalLM(cfg)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "mistral"])
def test_params_match_torch_count_of_hf_model(kind):
    cfg, model = _hf(kind)
    shape = Transformer.from_hf_config(cfg)
    unique = {id(p): p.numel() for p in model.parameters()}     # a tied matrix once
    assert shape.params() == sum(unique.values())


def test_unknown_hf_family_refused():
    transformers = pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="model_type 'bert' is not one of gpt2, llama, mistral"):
        Transformer.from_hf_config(transformers.BertConfig(num_hidden_layers=1, hidden_size=32,
                                                           num_attention_heads=2, intermediate_size=64))


def test_flops_match_narayanan_eq3():
    # Narayanan et al. SC'21 eq. (3) without recomputation: 72 B s l h^2 (1 + s/6h + V/12lh)
    m = Transformer(name="x", layers=4, hidden=256, heads=8, seq=128, vocab=1000)
    B, s, n, h, V = 3, m.seq, m.layers, m.hidden, m.vocab      # n: the paper's l (layers)
    want = 72 * B * s * n * h ** 2 * (1 + s / (6 * h) + V / (12 * n * h))
    assert m.flops_per_iteration(B) == pytest.approx(want, rel=1e-12)
    # with full recomputation: 96 B s l h^2 (1 + s/6h + V/16lh)
    want_r = 96 * B * s * n * h ** 2 * (1 + s / (6 * h) + V / (16 * n * h))
    assert m.flops_per_iteration(B, recompute=True) == pytest.approx(want_r, rel=1e-12)
    f = m.block_flops(1)
    assert f["backward_input"] + f["backward_weight"] == 2 * f["forward"]


def _gpt(**kw):
    base = dict(name="g", layers=8, hidden=512, heads=8, seq=256, vocab=1024)
    return Transformer(**{**base, **kw})


@pytest.mark.parametrize("t,sp,recompute", [(1, False, "none"), (4, False, "none"), (4, True, "none"),
                                            (4, True, "selective"), (2, False, "selective"),
                                            (1, False, "full"), (4, True, "full")])
def test_activation_bytes_match_korthikanti_table2(t, sp, recompute):
    m = _gpt()
    b, s, h, a = 2, m.seq, m.hidden, m.heads
    sbh = s * b * h
    # Korthikanti et al. 2022, Table 2 (per layer, 16-bit activations)
    if recompute == "full":
        want = 2 * sbh / (t if sp else 1)
    elif recompute == "selective":
        want = sbh * 34 / t if sp else sbh * (10 + 24 / t)
    elif sp:
        want = sbh / t * (34 + 5 * a * s / h)
    else:
        want = sbh * (10 + 24 / t + 5 * a * s / (h * t))
    par = Parallel(tensor=t, microbatch_size=b, recompute=recompute, sequence_parallel=sp)
    assert layer_activation_bytes(m, par) == pytest.approx(want, rel=1e-9)


def test_in_flight_first_stage_interleaved_matches_korthikanti():
    # Korthikanti §4.2.3: the first stage of interleaved 1F1B holds p (1 + (p-1)/(p v)) microbatches' layers
    for p, v in ((4, 2), (8, 3), (16, 4)):
        assert in_flight("interleaved", 0, p, 10 * p, v) == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert [in_flight("1f1b", i, 4, 8) for i in range(4)] == [4, 3, 2, 1]
    assert in_flight("gpipe", 2, 4, 8) == 8


def test_in_flight_matches_pipelab_schedules():
    """The closed forms against pipelab's own builders, counting forwards not yet freed by their last
    backward (B, or W where the backward is split) on a unit-cost run."""
    from pipelab.schedules import build
    from pipelab.schedules.dataflow import UnitCosts, run
    for method, key in (("1f1b-flush", "1f1b"), ("gpipe", "gpipe"), ("zb-h1", "zb-h1")):
        P, M = 4, 8
        events = run(build(method, P, microbatches=M), UnitCosts())
        for s in range(P):
            evs = sorted((e for e in events if e.stage == s and e.kind in "FBW"), key=lambda e: e.step)
            split = any(e.kind == "W" for e in evs)
            live = peak = 0
            for e in evs:
                live += e.kind == "F"
                live -= e.kind == ("W" if split else "B")
                peak = max(peak, live)
            assert peak == in_flight(key, s, P, M), (method, s)
    # interleaved: a worker's chunks in flight (each 1/v of its layers) against Megatron's warm-up count
    for P, M, v in ((4, 8, 2), (4, 12, 3), (8, 16, 2)):
        events = run(build("interleaved-1f1b", P, microbatches=M, chunks=v), UnitCosts())
        for w in range(P):
            live = peak = 0
            for e in sorted((e for e in events if e.worker == w and e.kind in "FB"), key=lambda e: e.step):
                live += 1 if e.kind == "F" else -1
                peak = max(peak, live)
            assert peak == in_flight("interleaved", w, P, M, v) * v, (P, M, v, w)


def test_memory_model_states_bytes_per_param():
    m = _gpt()
    par = Parallel(pipeline=2, microbatches=4, data=4)
    mem = memory_per_device(m, par, recipe="mixed-adam")
    from pipelab.llm.memory import stage_params
    for st in mem:
        n = stage_params(m, par, st.stage)
        assert st.weights + st.gradients + st.optimizer == 16 * n     # ZeRO §3.1
    z1 = memory_per_device(m, Parallel(**{**par.to_dict(), "sharding": "zero1"}), recipe="mixed-adam")
    assert z1[0].optimizer == pytest.approx(12 * stage_params(m, par, 0) / 4, abs=1)
    assert sum(stage_params(m, par, i) for i in range(2)) == m.params() + m.vocab * m.hidden  # tied copy


@pytest.mark.parametrize("kw,needle", [
    (dict(tensor=3), "heads; use tensor in [1, 2, 4]"),
    (dict(pipeline=3), "use pipeline x virtual in [1, 2, 4]"),
    (dict(pipeline=2, virtual=2, schedule="interleaved", microbatches=3), "multiple of pipeline=2"),
])
def test_divisibility_refused_with_nearest_choices(kw, needle):
    with pytest.raises(ParallelError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        Parallel(**kw).check(_gpt())


def test_batch_and_cluster_refusals():
    with pytest.raises(ParallelError, match="global batch 64 != data x microbatches x microbatch_size"):
        Parallel(data=2, microbatches=8, microbatch_size=2).check(_gpt(), global_batch=64)
    cl = Cluster.preset("dgx-a100", nodes=2)
    with pytest.raises(ParallelError, match="fast level"):
        Parallel(tensor=16, data=1).check(_gpt(heads=16), cl)
    Parallel(tensor=16).check(_gpt(heads=16), cl, allow_slow_tensor=True)


def test_tensor_comm_and_slow_links():
    m = _gpt(heads=16)
    cl = Cluster.preset("dgx-a100", nodes=2)
    inside = stage_costs(m, Parallel(tensor=8, microbatch_size=2), cl).stages[0]
    across = stage_costs(m, Parallel(tensor=16, microbatch_size=2), cl, allow_slow_tensor=True).stages[0]
    assert across.tensor_comm_forward_s > inside.tensor_comm_forward_s
    # a ring all-reduce of the block's activations, twice per block: 2 (t-1)/t n / busbw (+ latency)
    rates = device_table()["A100-SXM4-80GB"]
    n = 2 * 2 * m.seq * m.hidden
    lat = cl.levels[0].latency * 2 * 7
    per_block = 2 * (2 * 7 / 8 * n / rates.nvlink_busbw + lat)
    embed_ar = 2 * 7 / 8 * n / rates.nvlink_busbw + lat
    assert inside.tensor_comm_forward_s == pytest.approx(m.layers * per_block + embed_ar, rel=1e-9)
    sp = stage_costs(m, Parallel(tensor=8, microbatch_size=2, sequence_parallel=True), cl).stages[0]
    assert sp.tensor_comm_forward_s == pytest.approx(inside.tensor_comm_forward_s, rel=1e-9)


def test_recompute_adds_forward_to_backward():
    m, cl = _gpt(), Cluster.preset("dgx-a100", nodes=1)
    base = stage_costs(m, Parallel(pipeline=2, microbatches=2), cl).stages[1]
    full = stage_costs(m, Parallel(pipeline=2, microbatches=2, recompute="full"), cl).stages[1]
    sel = stage_costs(m, Parallel(pipeline=2, microbatches=2, recompute="selective"), cl).stages[1]
    assert base.recompute_s == 0 < sel.recompute_s < full.recompute_s
    assert full.backward_input_s == pytest.approx(base.backward_input_s + full.recompute_s)


def test_device_table_cites_every_quantity():
    for name in device_table():
        src = sources(name)
        assert src and all(len(v) > 10 for v in src.values()), name
    assert DeviceRates.of("h100").peak_flops("bf16") > DeviceRates.of("a100").peak_flops("bf16")


def test_json_round_trips():
    m = Transformer.preset("llama2-70b")
    assert Transformer.from_dict(m.to_dict()) == m
    par = Parallel(tensor=8, pipeline=4, data=2, microbatches=8, virtual=2, schedule="interleaved")
    assert Parallel.from_dict(par.to_dict()) == par
    costs = stage_costs(Transformer.preset("gpt3-1.3b"), Parallel(pipeline=2, microbatches=2),
                        Cluster.preset("dgx-a100", nodes=1))
    assert type(costs).from_dict(costs.to_dict()) == costs


def test_analytic_profile_flop_split_matches_measured():
    """The analytic Profile's per-layer forward FLOPs equal torch's FlopCounter on a real model."""
    from pipelab.models import PlainBlock, plain_gpt
    from pipelab.profile.measure import profile
    shape = Transformer(name="tiny", layers=2, hidden=64, heads=4, seq=32, vocab=50, tied=False,
                        precision="fp32", positions=False)
    net = plain_gpt(vocab=shape.vocab, hidden=shape.hidden, heads=shape.heads, layers=shape.layers)
    x = torch.randint(0, shape.vocab, (2, shape.seq))
    measured = profile(net, x, progress=False, repeats=1, warmup=0, small_batch=None, whole=False,
                       leaf_modules=(PlainBlock,))
    analytic = transformer_profile(shape, Parallel(microbatch_size=2), "a100")
    got = [ly.flops for ly in measured.layers]
    want = [ly.flops for ly in analytic.layers]
    # profiled layers: embedding, 2 blocks, norm, head (the analytic record has the same five)
    assert len(got) == len(want) == 5
    for g, w in zip(got, want):
        assert g == pytest.approx(w, rel=0.02), (got, want)
    assert sum(ly.param_bytes for ly in measured.layers) == 4 * shape.params()
    assert sum(ly.param_bytes for ly in analytic.layers) == 4 * shape.params()


def test_simulator_takes_the_analytic_profile():
    """pl.simulate runs the analytic Profile: its 1F1B time is at least the slowest stage's m (F + B) and
    at most (m + p - 1) of them plus the optimizer step."""
    import pipelab as pl
    m = _gpt(layers=4)
    prof = transformer_profile(m, Parallel(microbatch_size=1), "a100")
    cl = Cluster.preset("dgx-a100", nodes=1, gpus_per_server=2)
    plan = pl.Plan.from_boundaries(len(prof), [3], batch_size=4)
    # the profile is one microbatch's; the simulator splits a minibatch of 4 into 4 microbatches
    res = pl.simulate(plan, prof.at_batch_size(4), cl, "1f1b-flush", microbatches=4, optimizer="sgd")
    stage_s = [sum(ly.fwd_s + ly.bwd_s for ly in prof.layers[a:b]) for a, b in ((0, 3), (3, len(prof)))]
    slowest = max(stage_s)
    step = max(e.end_s - e.start_s for e in res.trace.events if e.kind == "U")   # the optimizer step
    assert 4 * slowest <= res.time_per_minibatch <= (4 + 1) * slowest * 1.05 + step


def test_data_parallel_sync_zero1_and_fsdp_closed_forms():
    """Gradient sync over a data group of one GPU per server (stride t = 8): a ring across servers at NCCL's
    per-adapter bus bandwidth; ZeRO-1 halves it into a reduce-scatter and adds the weights' all-gather;
    FSDP gathers the weights again before each microbatch's forward and backward."""
    from pipelab.llm.memory import stage_params
    m = _gpt(heads=8)
    cl = Cluster.preset("dgx-a100", nodes=4)
    rates = device_table()["A100-SXM4-80GB"]
    ib = cl.levels[1]
    base = dict(tensor=8, data=4, microbatches=2, dp_overlap=False)
    n = stage_params(m, Parallel(**base), 0)
    ring = 2 * 3 / 4 / rates.nic_busbw
    plain = stage_costs(m, Parallel(**base), cl)
    assert plain.dp_sync_s == pytest.approx(4 * n * ring + 2 * 3 * ib.latency)     # fp32 gradients
    assert plain.dp_exposed_s == plain.dp_sync_s
    z1 = stage_costs(m, Parallel(**base, sharding="zero1"), cl)
    assert z1.dp_sync_s == pytest.approx(plain.dp_sync_s / 2)
    assert z1.sharding_gather_s == pytest.approx((2 * n * ring + 2 * 3 * ib.latency) / 2)
    fsdp = stage_costs(m, Parallel(**base, sharding="fsdp"), cl)
    assert fsdp.sharding_gather_s == pytest.approx(z1.sharding_gather_s * (1 + 2 * 2))
    overlapped = stage_costs(m, Parallel(**{**base, "dp_overlap": True}), cl)
    st = overlapped.stages[0]
    assert overlapped.dp_exposed_s == pytest.approx(
        max(plain.dp_sync_s - st.backward_input_s - st.backward_weight_s,
            plain.dp_sync_s * min(1.0, 25 * 2**20 / (4 * n))))


def test_memory_refuses_bad_stage_layers_and_counts_uneven_ones():
    m = _gpt(layers=10)
    par = Parallel(pipeline=4, microbatches=4)
    with pytest.raises(ParallelError, match="do not split"):
        memory_per_device(m, par)
    with pytest.raises(ParallelError, match="add up to 9"):
        memory_per_device(m, par, stage_layers=[2, 3, 3, 1])
    mem = memory_per_device(m, par, stage_layers=[2, 3, 3, 2])
    per_layer = layer_activation_bytes(m, par)
    assert mem[1].activations == 3 * 3 * per_layer           # 1F1B: p - i = 3 in flight, 3 blocks


def test_tensor_shards_add_up_and_flash_keeps_no_scores():
    from pipelab.llm.memory import block_shard_params
    m = _gpt()
    replicated = 2 * 2 * m.hidden + 2 * m.hidden          # two norms (weight, bias), proj and MLP-down biases
    for t in (1, 2, 4, 8):
        assert t * block_shard_params(m, t) - (t - 1) * replicated == m.block_params()
    par = Parallel(tensor=2, microbatch_size=2)
    b, s, a = 2, m.seq, m.heads
    unfused, flash = layer_activation_bytes(m, par), layer_activation_bytes(m, par, "flash")
    assert unfused - flash == 5 * a * s * s * b // 2 - 4 * a * s * b // 2


def test_memory_over_the_device_is_refused_with_its_parts():
    from pipelab.llm import check_fits
    m = Transformer.preset("gpt3-175b")
    mem = memory_per_device(m, Parallel(tensor=8, pipeline=8, microbatches=8))
    want = r"stage 0 needs .* GiB per device \(weights .*activations .* GiB\) but a device has 80.00"
    with pytest.raises(ParallelError, match=want):
        check_fits(mem, 80 * 2**30)
    check_fits(mem, max(x.total for x in mem))


def test_more_refusals_by_name():
    with pytest.raises(ParallelError, match="key/value heads"):
        Parallel(tensor=4).check(_gpt(hidden=768, heads=12, kv_heads=6))
    with pytest.raises(ParallelError, match="virtual=2 needs schedule='interleaved'"):
        Parallel(pipeline=2, virtual=2)
    with pytest.raises(ParallelError, match="sequence_parallel=True needs tensor > 1"):
        Parallel(sequence_parallel=True)
    with pytest.raises(ParallelError, match="devices but cluster"):
        Parallel(tensor=8, pipeline=4).check(_gpt(), Cluster.preset("dgx-a100", nodes=2))
    with pytest.raises(ValueError, match="servers=2 and nodes=3 disagree"):
        Cluster.preset("dgx-a100", servers=2, nodes=3)
    with pytest.raises(ValueError, match="no rates for device 'tpu'"):
        DeviceRates.of("tpu")
