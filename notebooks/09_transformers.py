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
# # 09 · Bring your own transformer: a Hugging Face GPT-2 through the whole flow
#
# A small GPT-2 built from a `transformers` config (no download), passed to pipelab as it is:
# **profiled** at its own parts (embeddings, each block, final norm, head, named by module path),
# **partitioned** over 2-4 stages with its tied embedding/head shown in the partition graph,
# **trained for real** with 1F1B beside plain single-process training (the loss curves are equal), and
# drawn as a Gantt chart with per-stage memory. docs/transformers.md says what passes and what to wrap.
# Run all cells: under a minute and a half on a shared 2-core machine.

# %% tags=["parameters"]
# Parameters (papermill overrides these; change them and re-run everything)
stages = 2               # pipeline stages, one worker process each (2-4)
n_layer = 4              # GPT-2 blocks
method = "1f1b-flush"    # try "gpipe", "interleaved-1f1b" (needs more stages than workers), "zb-h1"
backend = "gloo"         # "gloo": one OS process per stage; "local": the single-process reference executor
microbatches = 2
batch_size = 8
steps = 6

# %%
import functools
import warnings

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

import pipelab as pl
from pipelab.models import demo
from pipelab.models.gpt import gpt_data, gpt_loss

transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore", message=".*measured on cpu.*")

# The model: GPT-2's own class from a small config; its head is tied to the token embedding (the default).
config = GPT2Config(n_layer=n_layer, n_embd=64, n_head=4, vocab_size=97, n_positions=32, bos_token_id=0,
                    eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model_fn = functools.partial(GPT2LMHeadModel, config)   # worker processes build it by name
model = model_fn()
print(type(model).__name__, f"{sum(p.numel() for p in model.parameters()) / 1e3:.0f}k parameters;",
      "head tied to the embedding:", model.lm_head.weight is model.transformer.wte.weight)

# Data: next-token sequences of a learnable recurrence; the loss reads the logits.
tokens, targets = gpt_data(batch_size * steps, vocab=97, seq_len=16, seed=0)
data = functools.partial(demo.batches, (tokens, targets), batch_size, shuffle=False)
optimizer = functools.partial(torch.optim.SGD, lr=0.5)
x, y = data()[0]

# %%
# 1. Profile. transformers 5 has no fx tracer and fx cannot trace GPT-2's forward (caches, masks,
# ModelOutput), so pipelab splits an HF causal LM at its own parts (pipelab.hf): each becomes one layer,
# named by its module path. The tied weight is found by identity and recorded in the profile.
prof = pl.profile(model, x, loss_fn=gpt_loss, target=y, progress=False, small_batch=None)
print(prof.tracing.describe())
print("layers:", ", ".join(prof.names))
print("shared parameters:", [t.names for t in prof.ties])
prof.summary()

# %%
# 2. Partition over `stages` workers. A cut is legal only where tensors alone cross it
# (prof.blocked_cuts lists the others; none here: the split passes tensors between blocks).
cluster = pl.Cluster.preset("pipedream-a", servers=1, gpus_per_server=stages)
plan = pl.partition(prof, cluster, "gpipe", stages=stages, microbatches=microbatches)
print(plan.describe())
pl.views.partition_graph(prof, plan)   # the dashed curve: the tied embedding/head and the stages holding it

# %%
# 3. Simulate the schedule with the profile's times (the tie's all-reduce is priced in the update).
sim = pl.simulate(plan, prof, cluster, method=method, microbatches=microbatches, minibatches=steps)
print(sim)
pl.views.gantt(sim.trace, title=f"simulated {method}")

# %%
# 4. Train for real, one process per stage, and plainly in this process with the same initial weights.
run = pl.train(model_fn, plan, method=method, data=data, loss_fn=gpt_loss, optimizer=optimizer, steps=steps,
               microbatches=microbatches, backend=backend, progress=False)

torch.manual_seed(0)                      # the runtime builds every stage's weights under seed 0 too
plain = model_fn()
opt = optimizer(plain.parameters())
plain_losses = []
for xb, yb in data()[:steps]:
    opt.zero_grad()
    loss = gpt_loss(plain(xb).logits, yb)
    loss.backward()
    opt.step()
    plain_losses.append(float(loss))

diff = max(float((run.state_dict()[k] - v).abs().max()) for k, v in plain.state_dict().items())
print(f"weights after {steps} steps: max |pipelined - plain| = {diff:.1e}")
assert diff < 1e-5 and max(abs(a - b) for a, b in zip(run.losses, plain_losses)) < 1e-5

# %%
import plotly.graph_objects as go

fig = go.Figure([go.Scatter(y=plain_losses, name="plain, one process", line={"width": 6}),
                 go.Scatter(y=run.losses, name=f"{method} on {stages} {backend} processes",
                            line={"dash": "dot"})])
fig.update_layout(title="the same loss curve", xaxis_title="step", yaxis_title="loss", height=320)

# %%
# 5. The run as it happened, and each stage's predicted memory (weights, optimizer state, activations).
pl.views.gantt(run.trace, title=f"measured {method} ({backend})")

# %%
pl.views.memory_breakdown(plan, prof)

# %% [markdown]
# **Exercise.** Code written the nanoGPT way reads `b, s, _ = x.shape` at the top of each block. Traced
# with the default rules, fx makes the shape a layer whose ints are used several layers later, and only
# tensors can cross a cut. Profile `pipelab.models.gpt.gpt(depth=2)` on `x`: how many boundaries carry a
# non-tensor value (`prof.blocked_cuts`)? Ask `pl.Plan.from_boundaries(..., profile=...)` for a cut at one
# of them and read the error. Then profile it with each block kept whole (`leaf_modules=[Block]`): what is
# left to refuse?
#
# *(The solution is the collapsed cell below: click its ellipsis to open it once you have tried.)*

# %% jupyter={"source_hidden": true} tags=["solution"]
from pipelab.models.gpt import Block, gpt

nano = gpt(vocab=97, d_model=32, heads=2, depth=2, max_len=16, seed=0)
quick = {"progress": False, "small_batch": None, "repeats": 1, "warmup": 0, "whole": False}
by_op = pl.profile(nano, x, **quick)
print(f"default tracing: {len(by_op)} layers, {len(by_op.blocked_boundaries)} of {len(by_op) - 1} "
      "boundaries carry a non-tensor value")
bad = min(by_op.blocked_boundaries) + 1       # a stage starting here would receive an int
try:
    pl.Plan.from_boundaries(len(by_op), [bad], profile=by_op)
except ValueError as exc:
    print("refused:", str(exc)[:300], "...")
by_block = pl.profile(nano, x, leaf_modules=[Block], **quick)
print(f"blocks kept whole: {len(by_block)} layers ({', '.join(by_block.names)}); still refused:")
for c in by_block.blocked_cuts:      # only the model's own top: tokens.shape[1] read by the position arange
    print(f"  the cut after {by_block.names[c.boundary]!r}: {c.reason()}")
first_block = by_block.names.index("blocks.0")
assert len(by_block.blocked_cuts) < len(by_op.blocked_cuts)
assert all(c.boundary < first_block for c in by_block.blocked_cuts)
# every partitioner returns only legal cuts either way
legal = by_op.legal_starts()
assert all(legal[st.start] for st in pl.partition(by_op, cluster, "gpipe", stages=stages).stages)

# %% [markdown]
# **Try:** `stages = 3` or `4` (the tie then spans the first and the last stage; both hold a copy and
# all-reduce its gradient before the update), `method = "gpipe"`, or a `LlamaForCausalLM` from a
# `LlamaConfig` (its head is untied by default). A model pipelab cannot split says which module failed
# and what to pass (`leaf_modules=`, `depth=`) or how to wrap it: docs/transformers.md.
