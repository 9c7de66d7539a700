"""Hugging Face causal LMs as users pass them, and one tracing configuration for the whole flow.

Oracles: the model's own forward (logits equal bit for bit) and plain single-process SGD of the whole
model (weights equal within 1e-6) after pipelined training, from Python and from the CLI job path.
"""

from __future__ import annotations

import json
import math

import hf_helpers as H
import pytest
import torch
from torch import nn

import pipelab as pl
from pipelab.cli.plan import main as plan_main
from pipelab.cli.profile import main as profile_main
from pipelab.cli.train import main as train_main
from pipelab.graph import layer_nodes, trace
from pipelab.tracing import TracingConfig

pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("make", [H.gpt2, H.gpt2_tied, H.llama])
def test_split_at_own_parts_equals_the_model(make):
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(0, H.VOCAB, (3, H.SEQ))
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    gm = trace(model)
    names = [str(n.target) for n in layer_nodes(gm) if n.op == "call_module"]
    blocks = "transformer.h" if "transformer.h.0" in names else "model.layers"
    parts = [n for n in names if n.startswith(blocks) or n == "lm_head"]
    assert parts == [f"{blocks}.0", f"{blocks}.1", "lm_head"]
    assert torch.equal(gm(ids), model(ids).logits)
    gm2 = trace(model, inputs=2)
    assert torch.equal(gm2(ids, mask)[mask.bool()], model(ids, attention_mask=mask).logits[mask.bool()])
    assert set(gm.state_dict()) == set(model.state_dict())


def _profile(make, data):
    x, _ = next(iter(data()))
    return pl.profile(make(), x, repeats=1, warmup=0, progress=False, small_batch=None, whole=False)


@pytest.mark.parametrize("make,data", [(H.gpt2, H.tokens), (H.llama, H.tokens), (H.gpt2, H.tokens_masked),
                                       (H.gpt2_tied, H.tokens)])
def test_profile_partition_simulate_train_equals_plain_sgd(make, data):
    prof = _profile(make, data)
    assert "lm_head" in prof.names and not prof.blocked_cuts
    assert prof.tracing.inputs == (2 if data is H.tokens_masked else 1)
    plan = pl.partition(prof, "pipedream-a:1x2", "gpipe", stages=2, microbatches=2)
    assert plan.tracing == prof.tracing
    sim = pl.simulate(plan, prof, "pipedream-a:1x2", "1f1b-flush", microbatches=2)
    assert math.isfinite(sim.time_per_minibatch) and sim.time_per_minibatch > 0
    run = pl.train(make, plan, method="1f1b-flush", data=data, loss_fn=H.lm_loss, optimizer=H.sgd, steps=2,
                   microbatches=2, backend="local", progress=False)
    assert H.max_diff(run.state_dict(), H.reference(make, data, 2)) < 1e-6


def test_an_unknown_hf_layout_and_an_untraceable_module_are_named():
    from transformers import BertConfig, BertModel

    bert = BertModel(BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                intermediate_size=64, vocab_size=H.VOCAB))
    with pytest.raises(TypeError, match="GPT-2's modules.*Llama's.*BertModel has neither.*nn.Sequential"):
        trace(bert)

    class Gate(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x      # control flow on a tensor value

    model = nn.Sequential(nn.Linear(3, 3), nn.Sequential(Gate()))
    with pytest.raises(TypeError, match=r"module '1.0' \(Gate\).*leaf_modules=\[Gate\] or depth=2"):
        trace(model)


def test_tracing_record_round_trips_and_contradictions_are_refused():
    cfg = TracingConfig.of([nn.Linear], depth=2)
    assert TracingConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.leaf_types() == (nn.Linear,)
    with pytest.raises(ValueError, match="cannot be imported"):
        TracingConfig(leaf_modules=("nowhere.at_all:Thing",)).leaf_types()
    from pipelab.tracing import resolve

    assert resolve(recorded=cfg)["depth"] == 2
    with pytest.raises(ValueError, match="differs from the plan's"):
        resolve(depth=1, recorded=cfg)


def test_depth_one_profile_trains_from_the_cli_job_path(tmp_path):
    """``pipelab profile --depth 1`` -> ``pipelab plan`` -> ``pipelab train job.json``: the plan carries
    the tracing, so the job needs no leaf_modules/depth and ends equal to plain SGD."""
    common = ["--input-shape", f"{H.BATCH},{H.SEQ}", "--input-dtype", "int64", "--vocab", str(H.VOCAB)]
    prof_json, plan_json = str(tmp_path / "prof.json"), str(tmp_path / "plan.json")
    assert profile_main(["--model", "hf_helpers:nanogpt", "--depth", "1", "--repeats", "1", "--warmup", "0",
                         "--small-batch", "0", "--quiet", "-o", prof_json, *common]) == 0
    prof = pl.Profile.load(prof_json)
    assert prof.tracing.depth == 1 and len(prof) < len(pl.profile(H.nanogpt(), next(H.tokens())[0], repeats=1,
                                                                  warmup=0, progress=False, small_batch=None,
                                                                  whole=False))
    assert plan_main([prof_json, "--cluster", "pipedream-a:1x2", "--method", "gpipe", "--microbatches", "2",
                      "-o", plan_json]) == 0
    assert pl.Plan.load(plan_json).tracing.depth == 1
    job = {"model_fn": "hf_helpers:nanogpt", "data": "hf_helpers:tokens", "loss_fn": "hf_helpers:lm_loss",
           "optimizer": "hf_helpers:sgd", "plan": "plan.json", "method": "1f1b-flush", "steps": 2,
           "microbatches": 2, "out": "out"}
    (tmp_path / "job.json").write_text(json.dumps(job))
    assert train_main([str(tmp_path / "job.json"), "--backend", "local", "--no-progress"]) == 0
    state = torch.load(tmp_path / "out" / "state_dict.pt")
    assert H.max_diff(state, H.reference(H.nanogpt, H.tokens, 2)) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("make", [H.gpt2_tied, H.llama])
def test_hf_from_the_cli_with_a_job_file_on_gloo(tmp_path, make):
    name = make.__name__
    prof_json, plan_json = str(tmp_path / "prof.json"), str(tmp_path / "plan.json")
    assert profile_main(["--model", f"hf_helpers:{name}", "--input-shape", f"{H.BATCH},{H.SEQ}",
                         "--input-dtype", "int64", "--vocab", str(H.VOCAB), "--repeats", "1", "--warmup", "0",
                         "--small-batch", "0",
                         "--quiet", "-o", prof_json]) == 0
    assert plan_main([prof_json, "--cluster", "pipedream-a:1x2", "--method", "gpipe", "--microbatches", "2",
                      "-o", plan_json]) == 0
    job = {"model_fn": f"hf_helpers:{name}", "data": "hf_helpers:tokens", "loss_fn": "hf_helpers:lm_loss",
           "optimizer": "hf_helpers:sgd", "plan": "plan.json", "method": "gpipe", "steps": 2,
           "microbatches": 2, "out": "out", "timeout": 120}
    (tmp_path / "job.json").write_text(json.dumps(job))
    assert train_main([str(tmp_path / "job.json"), "--no-progress"]) == 0
    state = torch.load(tmp_path / "out" / "state_dict.pt")
    assert H.max_diff(state, H.reference(make, H.tokens, 2)) < 1e-6


def test_the_torch_bridge_cuts_with_the_plans_tracing():
    """A plan from a depth-1 profile: the bridge cuts the model with depth 1 without being told."""
    from pipelab.schedules import build
    from pipelab.torch_bridge import stage_modules

    x, _ = next(H.tokens())
    prof = pl.profile(H.nanogpt(), x, depth=1, repeats=1, warmup=0, progress=False, small_batch=None,
                      whole=False)
    plan = pl.Plan.from_boundaries(len(prof), [len(prof) - 1], profile=prof)
    assert plan.tracing.depth == 1
    sched = build("gpipe", plan, microbatches=2)
    model = H.nanogpt()
    stages = {**stage_modules(plan, sched, model, rank=0), **stage_modules(plan, sched, model, rank=1)}
    out = stages[1](*stages[0](x))
    assert torch.allclose(out, model(x), atol=1e-6)
    with pytest.raises(ValueError, match="differs from the plan's"):
        stage_modules(plan, sched, model, rank=0, depth=2)
