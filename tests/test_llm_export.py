"""A planned LLM job exported for torchtitan and Megatron-LM, checked against each tool's documented
option names (tests/data/export_options/, extracted from the projects' sources at a recorded commit)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from pipelab.llm.parallel import Parallel, ParallelError
from pipelab.llm.shape import Transformer
from pipelab.planner.export import (
    ExportError,
    megatron_args,
    torchtitan_args,
    torchtitan_options,
    torchtitan_toml,
)

DATA = Path(__file__).parent / "data" / "export_options"


def _names(file: str) -> set[str]:
    lines = (DATA / file).read_text().splitlines()
    return {x.strip() for x in lines[1:] if x.strip()}


TITAN = _names("torchtitan_options.txt")
MEGATRON = _names("megatron_options.txt")
GPT = Transformer.preset("gpt3-175b")
LLAMA = Transformer.preset("llama2-70b")
PLANS = [
    Parallel(tensor=8, pipeline=8, data=16, microbatch_size=1, microbatches=96, recompute="selective",
             sequence_parallel=True, schedule="1f1b"),
    Parallel(tensor=8, pipeline=8, data=16, microbatch_size=2, microbatches=48, virtual=2, recompute="full",
             sequence_parallel=True, schedule="interleaved"),
    Parallel(tensor=4, pipeline=4, data=8, microbatch_size=1, microbatches=16, recompute="none",
             schedule="gpipe", sharding="fsdp"),
]


def test_the_lists_name_their_source_commit():
    for f in ("torchtitan_options.txt", "megatron_options.txt"):
        head = (DATA / f).read_text().splitlines()[0]
        assert head.startswith("# ") and " at " in head and len(head.split(" at ")[1].split()[0]) == 40


@pytest.mark.parametrize("par", [p for p in PLANS if p.sharding != "zero1"])
def test_torchtitan_names_are_documented_and_the_toml_parses(par):
    opts = torchtitan_options(GPT, par)
    for section, kv in opts.items():
        for k in kv:
            assert f"{section}.{k}" in TITAN, f"{section}.{k} is not a torchtitan JobConfig option"
    parsed = tomllib.loads(torchtitan_toml(GPT, par))
    assert parsed == opts
    for arg in torchtitan_args(GPT, par):
        name, value = arg[2:].split("=", 1)
        assert name in TITAN and value
    p = parsed["parallelism"]
    assert p["tensor_parallel_degree"] * p["pipeline_parallel_degree"] * p["data_parallel_replicate_degree"] \
        * p["data_parallel_shard_degree"] == par.devices
    assert parsed["training"]["global_batch_size"] == par.global_batch
    assert parsed["training"]["local_batch_size"] * par.data == par.global_batch
    if par.pipeline > 1:
        assert p["pipeline_parallel_layers_per_stage"] * par.pipeline * par.virtual == GPT.layers


@pytest.mark.parametrize("model", [GPT, LLAMA])
@pytest.mark.parametrize("par", PLANS[:2])
def test_megatron_flags_are_documented_and_carry_the_plan(model, par):
    args = megatron_args(model, par)
    flags = [a for a in args if a.startswith("--")]
    assert all(f in MEGATRON for f in flags), sorted(set(flags) - MEGATRON)
    value = {a: args[i + 1] for i, a in enumerate(args[:-1]) if not args[i + 1].startswith("--")}
    assert int(value["--tensor-model-parallel-size"]) == par.tensor
    assert int(value["--pipeline-model-parallel-size"]) == par.pipeline
    assert int(value["--global-batch-size"]) == par.global_batch
    assert int(value["--micro-batch-size"]) == par.microbatch_size
    assert int(value["--num-layers"]) == model.layers
    if par.virtual > 1:
        per_stage = int(value["--num-layers-per-virtual-pipeline-stage"])
        assert per_stage * par.pipeline * par.virtual == model.layers
    assert ("--sequence-parallel" in flags) == par.sequence_parallel
    assert ("--swiglu" in flags) == model.gated_mlp
    assert ("--group-query-attention" in flags) == (model.kv_heads != model.heads)


def test_a_plan_that_does_not_divide_the_model_is_refused():
    par = Parallel(tensor=8, pipeline=8, data=16, microbatches=48, virtual=3, schedule="interleaved")
    with pytest.raises(ParallelError, match="layers do not split"):
        megatron_args(LLAMA, par)
    with pytest.raises(ParallelError, match="layers do not split"):
        torchtitan_toml(LLAMA, par)


def test_what_a_tool_cannot_express_is_refused_by_name():
    zb = Parallel(tensor=8, pipeline=8, data=16, microbatches=96, schedule="zb-h1")
    with pytest.raises(ExportError, match="1F1B and interleaved"):
        megatron_args(GPT, zb)
    with pytest.raises(ExportError, match="pipeline_parallel_schedule_csv"):
        torchtitan_options(GPT, zb)
    zero1 = Parallel(tensor=8, pipeline=8, data=16, microbatches=96, sharding="zero1")
    with pytest.raises(ExportError, match="no ZeRO-1"):
        torchtitan_toml(GPT, zero1)
    assert "--use-distributed-optimizer" in megatron_args(GPT, zero1)
    fsdp = Parallel(tensor=4, pipeline=4, data=8, microbatches=16, sharding="fsdp")
    with pytest.raises(ExportError, match="FSDP is not exported"):
        megatron_args(GPT, fsdp)


def test_recompute_policies_export_to_what_each_tool_runs():
    op = Parallel(tensor=8, pipeline=8, data=16, microbatches=96, recompute="selective-op")
    assert torchtitan_options(GPT, op)["activation_checkpoint"] == {"mode": "selective",
                                                                    "selective_ac_option": "op"}
    assert "# recompute:" not in torchtitan_toml(GPT, op)
    with pytest.raises(ExportError, match="per-op save list"):
        megatron_args(GPT, op)
    core = Parallel(tensor=8, pipeline=8, data=16, microbatches=96, recompute="selective")
    assert "# recompute: pipelab priced Korthikanti" in torchtitan_toml(GPT, core)
    assert tomllib.loads(torchtitan_toml(GPT, core))["activation_checkpoint"]["mode"] == "selective"
    flags = megatron_args(GPT, core)
    assert flags[flags.index("--recompute-granularity") + 1] == "selective"
