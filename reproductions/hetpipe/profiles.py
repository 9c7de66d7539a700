"""VGG-19 and ResNet-152 (torchvision, random weights) profiled on this CPU, scaled to HetPipe's GPUs.

HetPipe's convergence claim is about VGG-19 and ResNet-152 at minibatch 32 on 224x224 ImageNet images
(Park et al., USENIX ATC'20). Profiling them at that size on a CPU takes minutes, so each model is
profiled once at a small size (:data:`CPU_IMAGE` pixels square, :data:`CPU_BATCH` samples), the
profile is cached as JSON beside this file (``profiles/<model>_cpu.json``, committed), and scaled:

* **to 224x224 and batch 32, per layer**: every layer's output, the values live across every cut and
  the model's input are *computed* at the target size (shapes propagated on PyTorch's meta device: no
  arithmetic); a layer's times and saved bytes are multiplied by its own output's growth (batch x
  pixels for a convolution, batch only for the classifier after the adaptive pooling);
* **to the GPU, one factor for the device**: :func:`device_factor` profiles torchvision's VGG-16 the
  same way and divides PipeDream's own VGG-16 profile (the one the Table 1 and HetPipe reproductions
  run, rebatched to 32) by it, total forward + backward time against total. The hetpipe cluster's
  speeds are relative to the device of PipeDream's profiles (speed 1.0; the HetPipe reproduction's
  simulated part treats it as the TITAN V), so the scaled profiles run on the same clock as that part.

Both steps are approximations and are stated as such: linear growth of a layer's time with its output
ignores that a CPU at 2x2 pixels and a GPU at 224x224 reach different efficiencies, and one factor for
the whole device ignores that convolutions and the classifier's matrix products speed up differently
on a GPU (:func:`device_factor` also returns the per-kind ratios, so the spread can be read).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.fx.passes.shape_prop import ShapeProp

from pipelab.graph import layer_nodes, live_across_cuts, trace
from pipelab.models import pipedream_profile
from pipelab.profile.measure import profile as measure_profile
from pipelab.profile.records import Layer, Profile

HERE = Path(__file__).resolve().parent
PROFILES = HERE / "profiles"
CPU_IMAGE = 64
CPU_BATCH = 2
TARGET_IMAGE = 224
TARGET_BATCH = 32          # HetPipe's minibatch
MODELS = ("vgg19", "resnet152")
CPU_MODELS = ("vgg16", "resnet50", *MODELS)   # the anchors and the models
ANCHOR = "vgg16"           # profiled here and shipped as PipeDream's profile: the CPU -> GPU factor


def _torchvision(name: str) -> torch.nn.Module:
    import torchvision

    torch.manual_seed(0)
    return getattr(torchvision.models, name)(weights=None).train()


def cpu_profile(name: str, *, refresh: bool = False) -> Profile:
    """``name``'s profile on this CPU at ``CPU_BATCH`` x 3 x ``CPU_IMAGE``^2, from the JSON cache if there."""
    path = PROFILES / f"{name}_cpu.json"
    if path.exists() and not refresh:
        return Profile.load(path)
    g = torch.Generator().manual_seed(0)
    sample = torch.randn(CPU_BATCH, 3, CPU_IMAGE, CPU_IMAGE, generator=g)
    t0 = time.perf_counter()
    prof = measure_profile(_torchvision(name), sample, device="cpu", repeats=3, progress=False,
                           model_name=name, small_batch=None)
    print(f"profiled {name} on this CPU in {time.perf_counter() - t0:.0f} s -> {path}", file=sys.stderr)
    PROFILES.mkdir(exist_ok=True)
    prof.save(path)
    return prof


def _numel(meta: object) -> int:
    """Elements of every tensor in an fx ``tensor_meta`` (a tensor's, or a tuple's)."""
    if meta is None:
        return 0
    if hasattr(meta, "shape"):
        return math.prod(meta.shape)  # type: ignore[attr-defined]
    if isinstance(meta, (tuple, list)):
        return sum(_numel(m) for m in meta)
    return 0


def _shapes(name: str, image: int) -> tuple[list[int], dict[str, int], int]:
    """Per layer, the output elements of one sample at ``image`` pixels; per value, its elements; input's."""
    gm = trace(_torchvision(name).to("meta"))
    ShapeProp(gm).propagate(torch.empty(1, 3, image, image, device="meta"))
    values = {n.name: _numel(n.meta.get("tensor_meta")) for n in gm.graph.nodes}
    outs = [values[n.name] for n in layer_nodes(gm)]
    return outs, values, 3 * image * image


def at_target(cpu: Profile, name: str, *, image: int = TARGET_IMAGE, batch: int = TARGET_BATCH,
              time_factor: float = 1.0) -> Profile:
    """``cpu`` (measured at ``CPU_IMAGE``) at ``image`` pixels and ``batch`` samples, times x ``time_factor``.

    Output, cut and input bytes are exact (shapes at the target size); a layer's times and saved bytes
    grow as its output does (see the module docstring)."""
    small, _, _ = _shapes(name, CPU_IMAGE)
    big, values, in_elems = _shapes(name, image)
    if len(small) != len(cpu.layers):
        raise ValueError(f"{name}: the cached profile has {len(cpu.layers)} layers, the model {len(small)}; "
                         f"delete {PROFILES / (name + '_cpu.json')} to re-profile")
    gm = trace(_torchvision(name).to("meta"))
    live = live_across_cuts(gm)
    elem = 4                                            # fp32
    b = batch / cpu.batch_size
    layers = []
    for layer, s, g in zip(cpu.layers, small, big):
        grow = b * (g / s if s else 1.0)               # per-minibatch growth of this layer's output
        tf = grow * time_factor
        layers.append(replace(layer, fwd_s=layer.fwd_s * tf, bwd_s=layer.bwd_s * tf,
                              fwd_fixed_s=layer.fwd_fixed_s * time_factor,
                              bwd_fixed_s=layer.bwd_fixed_s * time_factor,
                              wgrad_s=None if layer.wgrad_s is None else layer.wgrad_s * tf,
                              out_bytes=g * batch * elem, saved_bytes=int(layer.saved_bytes * grow),
                              flops=int(layer.flops * grow)))
    cuts = tuple(sum(values.get(v, 0) for v in cut) * batch * elem for cut in live)
    note = (f"measured on this CPU at batch {cpu.batch_size}, {CPU_IMAGE}x{CPU_IMAGE}, scaled per layer to "
            f"batch {batch}, {image}x{image}; times x{time_factor:.4g} (reproductions/hetpipe/profiles.py)")
    return replace(cpu, layers=tuple(layers), cut_bytes=cuts, batch_size=batch,
                   input_bytes=in_elems * batch * elem, loss_saved_bytes=int(cpu.loss_saved_bytes * b),
                   device="gpu (scaled from cpu)", source=f"{cpu.source}; {note}")


def _kind(kind: str) -> str:
    k = kind.lower()
    return "avgpool2d" if k == "adaptiveavgpool2d" else k


#: kinds priced by their FLOPs (compute-bound); every other kind by the bytes of its output
FLOP_KINDS = ("conv2d", "linear")
#: PipeDream's profiles whose per-kind GPU rates price the models (each paired with torchvision's model)
RATE_ANCHORS = ("vgg16", "resnet50")
#: each model is priced at the rates of its own family's anchor (layer shapes alike)
ANCHOR_OF = {"vgg19": "vgg16", "resnet152": "resnet50"}


def _measure(layer: Layer) -> float:
    return float(layer.flops if _kind(layer.kind) in FLOP_KINDS else layer.out_bytes)


def kind_rates(anchors: tuple[str, ...] = RATE_ANCHORS, batch: int = TARGET_BATCH) -> dict[str, float]:
    """GPU seconds per FLOP (convolution, linear) or per output byte (every other kind), per layer kind.

    For each kind: the forward + backward seconds PipeDream's profile of an anchor model spends in it
    (rebatched to ``batch``) over the FLOPs or output bytes torchvision's same model has in it at
    ``batch`` x 224x224 (:func:`at_target` of its CPU profile). The first anchor naming a kind wins."""
    rates: dict[str, float] = {}
    for a in anchors:
        ref = pipedream_profile(a).at_batch_size(batch)
        here = at_target(cpu_profile(a), a, batch=batch)
        for kind in sorted({_kind(x.kind) for x in ref.layers}):
            t = sum(x.fwd_s + x.bwd_s for x in ref.layers if _kind(x.kind) == kind)
            m = sum(_measure(x) for x in here.layers if _kind(x.kind) == kind)
            if kind not in rates and t > 0 and m > 0:
                rates[kind] = t / m
    return rates


def priced(prof: Profile, rates: dict[str, float]) -> Profile:
    """``prof`` (at its target size) with every layer's times from ``rates``; forward:backward split and
    weight-gradient share kept from the measured layer. A kind without a rate is priced as ReLU (bytes)."""
    layers = []
    for x in prof.layers:
        k = _kind(x.kind)
        t = _measure(x) * rates.get(k, rates["conv2d"] if k in FLOP_KINDS else rates["relu"])
        tot = x.fwd_s + x.bwd_s
        fb = x.fwd_s / tot if tot > 0 else 1 / 3
        wg = None if x.wgrad_s is None or not x.bwd_s else x.wgrad_s / x.bwd_s * t * (1 - fb)
        layers.append(replace(x, fwd_s=t * fb, bwd_s=t * (1 - fb), fwd_fixed_s=0.0, bwd_fixed_s=0.0,
                              wgrad_s=wg))
    note = (f"times priced per layer kind at PipeDream's GPU rates (FLOPs: {', '.join(FLOP_KINDS)}; "
            "output bytes: the rest)")
    return replace(prof, layers=tuple(layers), source=prof.source.split("; times x")[0] + "; " + note)


def device_factor(batch: int = TARGET_BATCH) -> float:
    """One factor for the device: PipeDream's VGG-16 time / this CPU's VGG-16 scaled to the same size
    (forward + backward totals, ``batch`` samples of 224x224): the alternative to :func:`kind_rates`."""
    here = at_target(cpu_profile(ANCHOR), ANCHOR, batch=batch)
    ref = pipedream_profile(ANCHOR).at_batch_size(batch)
    return (ref.fwd_s + ref.bwd_s) / (here.fwd_s + here.bwd_s)


def gpu_profile(name: str, how: str = "kinds") -> Profile:
    """``name`` at HetPipe's batch and image size on the clock of PipeDream's profiling GPU.

    ``how``: ``"kinds"`` (default) prices each layer by its FLOPs or bytes at the per-kind rates of
    PipeDream's profile of the same family (:data:`ANCHOR_OF`);
    ``"cpu-times"`` scales the CPU's measured times by one factor (:func:`device_factor`)."""
    if how == "kinds":
        return priced(at_target(cpu_profile(name), name), kind_rates((ANCHOR_OF[name],)))
    if how == "cpu-times":
        return at_target(cpu_profile(name), name, time_factor=device_factor())
    raise ValueError(f"how={how!r} must be 'kinds' or 'cpu-times'")


def validation() -> list[dict[str, object]]:
    """Each anchor priced with the *other* anchor's rates (ReLU's per byte where it has no such kind),
    against its own PipeDream profile: the error of pricing a model by rates it did not set."""
    out: list[dict[str, object]] = []
    for a, b in ((RATE_ANCHORS[0], RATE_ANCHORS[1]), (RATE_ANCHORS[1], RATE_ANCHORS[0])):
        est = priced(at_target(cpu_profile(a), a), kind_rates((b,)))
        ref = pipedream_profile(a).at_batch_size(TARGET_BATCH)
        out.append({"model": a, "rates_from": b, "priced_ms": round((est.fwd_s + est.bwd_s) * 1e3, 1),
                    "pipedream_ms": round((ref.fwd_s + ref.bwd_s) * 1e3, 1),
                    "ratio": round((est.fwd_s + est.bwd_s) / (ref.fwd_s + ref.bwd_s), 3)})
    return out


if __name__ == "__main__":
    for m in CPU_MODELS:
        p = cpu_profile(m, refresh="--refresh" in sys.argv)
        print(f"{m}: {len(p.layers)} layers, fwd+bwd {(p.fwd_s + p.bwd_s) * 1e3:.1f} ms on this CPU "
              f"(batch {p.batch_size}, {CPU_IMAGE}x{CPU_IMAGE})")
    for a in RATE_ANCHORS:
        print(f"rates from {a}:", ", ".join(f"{k} {v:.3g}" for k, v in kind_rates((a,)).items()))
    print(f"one device factor (PipeDream's VGG-16 / this CPU's, scaled): {device_factor():.4g}")
    for v in validation():
        print("validation:", v)
    for m in MODELS:
        for how in ("kinds", "cpu-times"):
            g = gpu_profile(m, how)
            print(f"{m} ({how}): fwd+bwd {(g.fwd_s + g.bwd_s) * 1e3:.1f} ms per minibatch of {g.batch_size}, "
                  f"weights {g.param_bytes / 1e6:.0f} MB, input {g.input_bytes / 1e6:.1f} MB")
