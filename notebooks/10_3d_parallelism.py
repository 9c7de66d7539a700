# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 10 · 3D parallelism: planning GPT-3 on 1,024 A100s
#
# A 175-billion-parameter model does not fit one GPU: its weights alone are 350 GB in 16 bits, and
# mixed-precision Adam keeps 16 bytes per parameter. Large trainings split it three ways at once
# (Narayanan et al., SC'21):
#
# - **tensor parallelism** `t` splits every layer's matrices over the GPUs of one node (NVSwitch),
#   paying two all-reduces per block in the forward and two in the backward (Shoeybi et al. 2019);
# - **pipeline parallelism** `p` gives each group of nodes a slice of the layers, paying a bubble while
#   the pipeline fills and drains: `(p − 1) / (v·m)` of the ideal time with `m` microbatches and `v`
#   virtual stages per GPU (SC'21 §2.2);
# - **data parallelism** `d` repeats the whole pipeline, paying one gradient all-reduce per iteration
#   over InfiniBand (or a reduce-scatter and all-gather when the optimizer state is sharded, ZeRO-1).
#
# `t · p · d` is the GPU count. Memory decides which splits are possible at all: weights, gradients and
# optimizer states divide by `t · p` (and ZeRO-1's states by `d` too), the activations of the microbatches
# in flight by `t` (with sequence parallelism) and shrink with recomputation (Korthikanti et al. 2022).
#
# pipelab simulates **one** pipeline of such a job with the very schedule the runtime executes, the tensor
# group folded into each stage's cost and data parallelism at the step's end.

# %% tags=["parameters"]
model_name = "gpt3-175b"     # a pipelab.llm.shape preset
gpus = 1024
cluster_name = "dgx-a100"    # 8 A100 80 GB per node on NVSwitch, 8 HDR InfiniBand NICs per node
global_batch = 1536          # sequences of 2,048 tokens (GPT-3's 3.2M tokens, Brown et al. 2020 Table 2.1)
shortlist = 4                # closed-form best candidates the planner simulates
gantt_rounds = 2             # the drawn pipeline runs this many microbatches per stage (so every box shows)

# %%
import pandas as pd
import plotly.graph_objects as go

import pipelab as pl
from pipelab.llm.memory import memory_per_device
from pipelab.llm.parallel import Parallel
from pipelab.llm.reserved import reserved_memory
from pipelab.llm.shape import Transformer
from pipelab.planner.export import ExportError, megatron_args, torchtitan_toml

model = Transformer.preset(model_name)
cluster = f"{cluster_name}:{gpus}"
print(model.describe())

# %% [markdown]
# ## The planner's pick
#
# `pl.plan_llm` enumerates tensor, pipeline and data degrees, microbatch size and count, the pipeline order
# (1F1B, interleaved with `v` virtual stages, ZB-H1), recomputation and sharding; refuses what does not
# divide or does not fit 80 GB; estimates the rest in closed form and simulates the shortlist.

# %%
table = pl.plan_llm(model, cluster, global_batch, shortlist=shortlist)
print(table.describe())
table.to_dataframe().head(8)

# %%
print(table.explain())

# %% [markdown]
# ## Against hand-made plans
#
# Three plans a person might write: SC'21's own choice for a model this size (t=8, p=8, full
# recomputation, plain 1F1B), the same with selective recomputation and sequence parallelism
# (Korthikanti et al.), and a shallower pipeline without recomputation.

# %%
m_of = lambda t, p, b=1: global_batch // ((gpus // (t * p)) * b)  # noqa: E731
hand = {
    "SC'21: t=8 p=8, full recompute": Parallel(tensor=8, pipeline=8, data=gpus // 64, microbatches=m_of(8, 8),
                                              recompute="full", sequence_parallel=False),
    "t=8 p=8, selective + SP": Parallel(tensor=8, pipeline=8, data=gpus // 64, microbatches=m_of(8, 8),
                                        recompute="selective", sequence_parallel=True),
    "t=8 p=4, no recompute": Parallel(tensor=8, pipeline=4, data=gpus // 32, microbatches=m_of(8, 4),
                                      sequence_parallel=True),
    "planner's pick": table.best.parallel,
}
results = {name: pl.simulate_llm(model, cluster, par) for name, par in hand.items()}
rows = [{"plan": name, "s/iteration": r.time_per_iteration_s, "model TFLOP/s/GPU": r.model_tflops_per_gpu,
         "MFU": r.model_flops_utilization, "hardware TFLOP/s/GPU": r.hardware_tflops_per_gpu,
         "HFU": r.hardware_flops_utilization, "bubble": r.bubble_fraction,
         "peak GiB": r.peak_memory / 2**30, "fits 80 GB": r.peak_memory <= r.memory_limit}
        for name, r in results.items()]
pd.DataFrame(rows).set_index("plan").round(3)

# %% [markdown]
# Model FLOPs count each multiply-add of the forward and backward once; hardware FLOPs also count the
# recomputed forward. Full recomputation raises HFU but not MFU: the GPU is busy with work the model did
# not need. A plan that does not fit is not a plan: the planner refuses it with its figures, e.g.

# %%
try:
    pl.plan_llm(model, cluster, global_batch, tensor=8, pipeline=4, recompute="none", sharding="none",
                schedule="1f1b", microbatch_size=4)
except ValueError as exc:
    print(exc)

# %% [markdown]
# ## Memory per stage
#
# The first stages hold the most activations: under 1F1B stage `s` keeps `p − s` microbatches in flight.

# %%
pick = results["planner's pick"]
fig = go.Figure()
for part in ("weights", "gradients", "optimizer", "activations", "gathered"):
    fig.add_bar(name=part, x=[f"stage {m.stage}" for m in pick.memory],
                y=[m.parts()[part] / 2**30 for m in pick.memory])
fig.add_hline(y=pick.memory_limit / 2**30, line_dash="dash", annotation_text="device memory")
fig.update_layout(barmode="stack", yaxis_title="GiB per GPU", title="planner's pick: memory per device")
fig

# %% [markdown]
# ## What the GPU will report: reserved, not allocated
#
# The bars above are *allocated* bytes: what tensors hold. A training log reports what PyTorch's caching
# allocator has *reserved* (`torch.cuda.memory_stats()["reserved_bytes.all.peak"]`), which adds the free
# space stranded between live blocks and in other streams' pools. `reserved_memory` records a torchtitan
# step on the meta device (no memory used) and replays its allocations through the allocator's rules.
# torchtitan published 82.4 GiB per H100 for this run (Llama 3.1 8B, FSDP over 8 GPUs, local batch 2,
# per-operator checkpointing):

# %%
llama8b = Transformer(name="llama3.1-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336,
                      vocab=128256, seq=8192, tied=False, gated_mlp=True, bias=False, positions=False)
fsdp8 = Parallel(data=8, microbatch_size=2, recompute="selective-op", sharding="fsdp")
closed = memory_per_device(llama8b, fsdp8, recipe="fp32-adam-bf16-compute", attention="flash",
                           loss="upcast", kernels="eager")[0].total
replayed = reserved_memory(llama8b, fsdp8)
print(f"allocated, closed form {closed / 2**30:.1f} GiB; replay: allocated "
      f"{replayed.peak_allocated / 2**30:.1f} GiB, reserved {replayed.peak_reserved / 2**30:.1f} GiB; "
      "torchtitan's log: 82.4 GiB")

# %% [markdown]
# Leave that much room when a plan's allocated bytes come close to the device's memory.

# %% [markdown]
# ## One pipeline, drawn
#
# The same pick with fewer microbatches (`gantt_rounds` per stage) so that every box shows. Grey bars are
# communication: `tensor` at the end of each forward and backward (the tensor group's all-reduces or
# reduce-scatters folded into the stage), `send` between stages, and `allreduce` before the optimizer
# step (the exposed part of the data-parallel gradient synchronisation).

# %%
small = Parallel(**{**pick.parallel.to_dict(), "microbatches": gantt_rounds * pick.parallel.pipeline})
small_res = pl.simulate_llm(model, cluster, small)
print(small_res.describe())
pl.views.gantt(small_res.trace, title="one pipeline of the pick (tensor and data parallelism folded in)")

# %% [markdown]
# ## Run it for real
#
# The pick written for torchtitan and for Megatron-LM (what a tool cannot express is refused by name).

# %%
best = table.best.parallel
for name, write in (("torchtitan", lambda: torchtitan_toml(model, best)),
                    ("Megatron-LM", lambda: " ".join(megatron_args(model, best)))):
    try:
        print(f"--- {name}\n{write()}")
    except ExportError as exc:
        print(f"--- {name}: {exc}")
if best.sharding == "zero1":
    # torchtitan's own way to shard the optimizer state is FSDP; simulate that variant before you use it
    fsdp = Parallel(**{**best.to_dict(), "sharding": "fsdp"})
    print(f"--- torchtitan, FSDP variant ({pl.simulate_llm(model, cluster, fsdp).summary()})")
    print(torchtitan_toml(model, fsdp))

# %% [markdown]
# ## Exercise
#
# The bubble share of plain 1F1B is `(p − 1) / (m + p − 1)` of the iteration's pipeline time when stages are
# equal. Simulate SC'21's plan (t=8, p=8, full recomputation, `data` unchanged, so the global batch shrinks)
# with `microbatches` 8, 16 and 32 per pipeline and compare the simulated bubble with the formula. Why is the
# simulated one a little larger?
#
# *(The solution is the collapsed cell below: click its ellipsis to open it once you have tried.)*

# %% jupyter={"source_hidden": true} tags=["solution"]
# Solution: the simulated bubble also holds the sends between stages and the first and last stages'
# embedding and head, which make those stages slower than the others.
for m in (8, 16, 32):
    par = Parallel(tensor=8, pipeline=8, data=gpus // 64, microbatches=m, recompute="full")
    r = pl.simulate_llm(model, cluster, par)
    print(f"m={m:3d}: simulated bubble {r.bubble_fraction:.3f}, closed form {(8 - 1) / (m + 8 - 1):.3f}")
