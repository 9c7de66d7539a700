"""A planned LLM job written for the tools that run it: torchtitan (TOML, command line) and Megatron-LM.

The option names are those documented by each project (the lists checked in
``tests/data/export_options/``, with the source file and commit): torchtitan's ``JobConfig`` sections
(``torchtitan/config/job_config.py``) and Megatron-LM's ``megatron/training/arguments.py`` flags. What a
tool cannot express is refused by name, never approximated, and a plan that does not divide the model
is refused first (:meth:`Parallel.check`): torchtitan has no ZeRO-1 (it shards with
FSDP); Megatron-LM runs no GPipe or ZB-H1 order.
"""

from __future__ import annotations

from pipelab.llm.parallel import Parallel
from pipelab.llm.shape import Transformer

#: torchtitan's pipeline_parallel_schedule names (torch.distributed.pipelining.schedules) per pipelab order
TORCHTITAN_SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe"}
#: torchtitan's activation_checkpoint.mode per pipelab recompute policy. "selective-op" is torchtitan's
#: per-op save list exactly. "selective" (Korthikanti et al.'s attention core) has no torchtitan policy: it
#: maps to the nearest, per-op SAC, and the TOML says so in a comment
TORCHTITAN_RECOMPUTE = {"none": ("none", None), "selective": ("selective", "op"),
                        "selective-op": ("selective", "op"), "full": ("full", None)}
#: the TOML comment written where the exported policy is not the one pipelab priced
SELECTIVE_NOTE = ("# recompute: pipelab priced Korthikanti et al.'s selective policy (the attention core); "
                  "torchtitan has none, so this asks for its per-op save list, which keeps other tensors: "
                  "plan with recompute='selective-op' to price what torchtitan runs")


class ExportError(ValueError):
    """The plan uses something the target tool cannot express."""


def torchtitan_options(model: Transformer, parallel: Parallel) -> dict[str, dict[str, object]]:
    """The plan as torchtitan ``JobConfig`` sections: ``{"parallelism": {...}, "training": {...}, ...}``.

    The model's shape itself is a torchtitan model flavor (``model.name``/``model.flavor``), which this
    does not write."""
    parallel.check(model)
    if parallel.schedule not in TORCHTITAN_SCHEDULES:
        raise ExportError(f"torchtitan has no named schedule for pipelab's {parallel.schedule!r}; its names "
                          f"are {sorted(TORCHTITAN_SCHEDULES.values())} (a custom order goes through "
                          "parallelism.pipeline_parallel_schedule_csv: "
                          "pl.schedules.torch_format.to_torch_csv)")
    if parallel.sharding == "zero1":
        raise ExportError("torchtitan shards with FSDP (parallelism.data_parallel_shard_degree) or "
                          "replicates (data_parallel_replicate_degree) and has no ZeRO-1: plan with "
                          "sharding='fsdp' or 'none'")
    shard = parallel.data if parallel.sharding == "fsdp" else 1
    replicate = 1 if parallel.sharding == "fsdp" else parallel.data
    par: dict[str, object] = {
        "tensor_parallel_degree": parallel.tensor,
        "pipeline_parallel_degree": parallel.pipeline,
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "pipeline_parallel_schedule": TORCHTITAN_SCHEDULES[parallel.schedule],
        "pipeline_parallel_microbatch_size": parallel.microbatch_size,
    }
    if parallel.pipeline > 1:
        # even (virtual) stages of blocks, as pipelab priced them
        par["pipeline_parallel_layers_per_stage"] = model.layers // parallel.stages
        par["pipeline_parallel_first_stage_less_layers"] = 0
        par["pipeline_parallel_last_stage_less_layers"] = 0
    mode, option = TORCHTITAN_RECOMPUTE[parallel.recompute]
    ac: dict[str, object] = {"mode": mode}
    if option is not None:
        ac["selective_ac_option"] = option
    dtype = {"bf16": "bfloat16", "fp32": "float32"}.get(model.precision)
    training: dict[str, object] = {
        "local_batch_size": parallel.microbatches * parallel.microbatch_size,   # per data-parallel rank
        "global_batch_size": parallel.global_batch,
        "seq_len": model.seq,
    }
    if dtype is not None:
        training["mixed_precision_param"] = dtype
    return {"training": training, "parallelism": par, "activation_checkpoint": ac}


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def torchtitan_toml(model: Transformer, parallel: Parallel) -> str:
    """The plan as a torchtitan TOML job file (the sections :func:`torchtitan_options` writes)."""
    lines = [f"# pipelab plan for {model.name}: {parallel.describe()}",
             f"# run on {parallel.devices} GPUs (NGPU x nodes); the model shape is a torchtitan flavor"]
    if parallel.recompute == "selective":
        lines.append(SELECTIVE_NOTE)
    for section, opts in torchtitan_options(model, parallel).items():
        lines += ["", f"[{section}]"] + [f"{k} = {_toml_value(v)}" for k, v in opts.items()]
    return "\n".join(lines) + "\n"


def torchtitan_args(model: Transformer, parallel: Parallel) -> list[str]:
    """The plan as torchtitan command-line overrides: ``--section.option=value``."""
    return [f"--{section}.{k}={v}" for section, opts in torchtitan_options(model, parallel).items()
            for k, v in opts.items()]


def megatron_args(model: Transformer, parallel: Parallel) -> list[str]:
    """The plan (and the model's shape) as Megatron-LM ``pretrain_gpt.py`` arguments."""
    parallel.check(model)
    if parallel.schedule not in ("1f1b", "interleaved"):
        raise ExportError(f"Megatron-LM runs 1F1B and interleaved 1F1B only; pipelab's {parallel.schedule!r} "
                          "has no Megatron-LM flag: plan with schedule='1f1b' or 'interleaved'")
    if parallel.sharding == "fsdp":
        raise ExportError("this export writes Megatron-LM's distributed optimizer (ZeRO-1, "
                          "--use-distributed-optimizer); FSDP is not exported: plan with sharding='zero1' or "
                          "'none'")
    args = ["--num-layers", str(model.layers), "--hidden-size", str(model.hidden),
            "--num-attention-heads", str(model.heads), "--ffn-hidden-size", str(model.ffn),
            "--seq-length", str(model.seq), "--max-position-embeddings", str(model.seq),
            "--tensor-model-parallel-size", str(parallel.tensor),
            "--pipeline-model-parallel-size", str(parallel.pipeline),
            "--micro-batch-size", str(parallel.microbatch_size),
            "--global-batch-size", str(parallel.global_batch)]
    if model.kv_heads != model.heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    if model.gated_mlp:
        args.append("--swiglu")
    if not model.tied:
        args.append("--untie-embeddings-and-output-weights")
    if model.precision in ("bf16", "fp16"):
        args.append(f"--{model.precision}")
    if parallel.virtual > 1:
        args += ["--num-layers-per-virtual-pipeline-stage", str(model.layers // parallel.stages)]
    if parallel.sequence_parallel:
        args.append("--sequence-parallel")
    if parallel.recompute == "selective-op":
        raise ExportError("Megatron-LM has no per-op save list like torchtitan's (recompute='selective-op'): "
                          "plan with recompute='selective' (Megatron-LM's --recompute-granularity "
                          "selective), 'full' or 'none'")
    if parallel.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif parallel.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform",
                 "--recompute-num-layers", "1"]
    if parallel.sharding == "zero1":
        args.append("--use-distributed-optimizer")
    if parallel.dp_overlap and parallel.data > 1:
        args.append("--overlap-grad-reduce")
    return args
