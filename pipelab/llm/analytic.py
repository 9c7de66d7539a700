"""An analytic :class:`~pipelab.profile.Profile` of a transformer: one layer per embedding, block,
final norm and head, priced by :mod:`pipelab.llm.costs` on a device's rates.

So the existing partitioners, simulator and views take a model that was never run: its times are
per microbatch of ``batch_size`` sequences on one device of a tensor group (the tensor communication of
each block folded into its times), its FLOPs the forward's matmul FLOPs per device, its saved bytes
Korthikanti et al.'s activations (:mod:`pipelab.llm.memory`).
"""

from __future__ import annotations

from pipelab.cluster import Cluster
from pipelab.llm.costs import _embedding_s, _head_s, block_costs
from pipelab.llm.devices import DeviceRates
from pipelab.llm.memory import block_shard_params, layer_activation_bytes
from pipelab.llm.parallel import Parallel, ParallelError
from pipelab.llm.shape import Transformer
from pipelab.profile.records import Layer, Profile


def transformer_profile(model: Transformer, parallel: Parallel | int = 1, device: DeviceRates | str = "a100",
                        *, cluster: Cluster | None = None, microbatch_size: int | None = None,
                        attention: str = "unfused") -> Profile:
    """The per-layer Profile of ``model`` on ``device`` for one microbatch.

    Args:
        parallel: a :class:`Parallel` or a tensor degree (its tensor, sequence-parallel, recompute and
            microbatch size are used).
        cluster: prices the tensor all-reduces (none: compute only).
        microbatch_size: sequences per microbatch (default ``parallel.microbatch_size``).

    Returns:
        A Profile of one microbatch (``batch_size`` = its sequences); for ``M`` microbatches per
        minibatch give the simulator ``profile.at_batch_size(M * batch_size)``.

    Raises:
        ParallelError: for ``tensor_overlap=True``, which a Profile cannot express.
    """
    par = parallel if isinstance(parallel, Parallel) else Parallel(tensor=int(parallel))
    if par.tensor_overlap:
        raise ParallelError("transformer_profile folds each block's tensor collectives into its times, so it "
                            "cannot hide them behind the weight-gradient GEMMs (which depends on whether the "
                            "schedule splits W off): use pl.simulate_llm, which prices tensor_overlap, or "
                            "tensor_overlap=False")
    if microbatch_size is not None:
        par = Parallel(**{**par.to_dict(), "microbatch_size": microbatch_size})
    par.check(model)
    rates = DeviceRates.of(device)
    t, e = par.tensor, model.bytes_per_element
    b, s, h = par.microbatch_size, model.seq, model.hidden
    act = e * b * s * h // t if par.sequence_parallel else e * b * s * h
    blk = block_costs(model, par, rates, cluster, attention=attention)
    n_blk = block_shard_params(model, t)
    emb = _embedding_s(model, par, rates)
    hf, hb, hw = _head_s(model, par, rates)
    head_params = model.vocab * h if not model.tied else 0
    layers = [Layer("embedding", "Embedding", fwd_s=emb, bwd_s=emb, out_bytes=act,
                    param_bytes=e * model.embedding_params() // t, flops=0, saved_bytes=b * s * h,
                    wgrad_s=emb, param_tensors=2 if model.positions else 1)]
    bwd = blk.backward_total_s            # nothing hidden: tensor_overlap is refused above
    saved = layer_activation_bytes(model, par, attention)
    for k in range(model.layers):
        layers.append(Layer(f"block.{k}", "TransformerBlock", fwd_s=blk.forward_total_s,
                            bwd_s=bwd, out_bytes=act, param_bytes=e * n_blk, flops=blk.forward_flops,
                            saved_bytes=saved, wgrad_s=blk.backward_weight_s,
                            param_tensors=12 if model.bias else 9))
    norm_s = rates.stream_s(2 * e * b * s * h)
    layers.append(Layer("final_norm", "LayerNorm", fwd_s=norm_s, bwd_s=2 * norm_s, out_bytes=act,
                        param_bytes=e * model.final_norm_params(), flops=0, saved_bytes=act, wgrad_s=0.0,
                        param_tensors=2 if model.bias else 1))
    layers.append(Layer("head", "Linear", fwd_s=hf, bwd_s=hb + hw, out_bytes=4 * b * s * model.vocab // t,
                        param_bytes=e * head_params // t, flops=2 * b * s * h * model.vocab // t,
                        saved_bytes=act + 4 * b * s * model.vocab // t, wgrad_s=hw,
                        param_tensors=0 if model.tied else 1))
    cuts = tuple(ly.out_bytes for ly in layers[:-1])
    return Profile(layers=tuple(layers), cut_bytes=cuts, batch_size=b, dtype=model.precision,
                   device=rates.name,
                   input_bytes=8 * b * s, model=model.name, source="synthetic")
