"""PipeDream's Table 1 rows as PipeDream ran them: its batch size, its transports, its own configurations.

Facts from PipeDream's repository (msr-fiddle/pipedream @ 11c40c0, MIT licence): every Table 1 run's
driver config (``runtime/*/driver_configs/*.yml``) sets ``batch_size: 64`` per worker, and
``distributed_backend: nccl`` for the data-parallel runs, ``gloo`` for the pipelined ones (whose
replicated stages' DistributedDataParallel groups inherit gloo: ``runtime/runtime.py``); gloo moves a
tensor between stages through host memory (``runtime/communication.py``: ``tensor.cpu()``, send,
``.cuda()``). The configuration each pipelined run used is a file (:mod:`.pipedream_conf`).

The optimizer is PipeDream's own per model: momentum SGD for the image models
(``runtime/image_classification/main_with_runtime.py``), Adam for GNMT (``use_adam_optimizer = True`` in
``runtime/translation/main_with_runtime.py``): :data:`PAPER_OPTIMIZERS`.

The two parameters PipeDream does not state are cited, not fitted (see the Table 1 README):

* the profiling GPU's speed relative to the paper's V100: :data:`V100_RESNET50_IMAGES_PER_S` (a
  V100-16GB's published FP32 PyTorch training throughput of ResNet-50, an SXM2 module) over the throughput
  PipeDream's own ResNet-50 profile implies (:func:`profiling_gpu_speed`); cluster A's V100s are PCIe
  cards, at :data:`pipelab.cluster.V100_PCIE_OVER_SXM2` of that (NVIDIA's datasheet);
* NCCL's all-reduce bus bandwidth over TCP on 10 and 25 Gbps Ethernet:
  :data:`pipelab.transports.NCCL_TCP_BUS_BANDWIDTH`.

NCCL's bus bandwidth inside a cluster-A server is a measurement on that instance family (Azure NCv3,
V100 PCIe), :data:`pipelab.cluster.NCCL_NCV3_PCIE_BUS_BANDWIDTH`, not the PCIe link's rate:
:data:`PAPER_NCCL_BUS_BANDWIDTH`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pipelab.cluster import NCCL_MEASURED_BUS_BANDWIDTH, V100_PCIE_OVER_SXM2, Cluster
from pipelab.costs import CostModel
from pipelab.models import pipedream_profile
from pipelab.partition import partition
from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile
from pipelab.transports import GLOO_ALLREDUCE_BUS_BANDWIDTH, NCCL_TCP_BUS_BANDWIDTH, nccl_flat_ring
from reproductions._common.report import svg_heatmap
from reproductions.pipedream_table1.pipedream_conf import plan_from_pipedream
from reproductions.pipedream_table1.rows import TABLE1, PaperRow, config_shape, simulate_plan

if TYPE_CHECKING:
    import pandas as pd

#: per-worker minibatch of every Table 1 run (``batch_size: 64`` in each driver config)
PAPER_BATCH = 64
#: V100-16GB, FP32, PyTorch, ResNet-50 (v1.5), 1 GPU: 367 images/s. NVIDIA DeepLearningExamples,
#: PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "Training performance: NVIDIA DGX-1 16GB
#: (8x V100 16GB)" (pytorch-21.03 container). Fixed before any comparison with Table 1.
V100_RESNET50_IMAGES_PER_S = 367.0
#: the same benchmark with each of 2 processes pinned to one core of a Xeon E5-2620 v4 (2.1 GHz), 40 GbE,
#: 20 MB: 1.073 GB/s on average, not rising with the size (pytorch/gloo issue #248, 2020): one core's
#: rate, a cited alternative to :data:`~pipelab.transports.GLOO_ALLREDUCE_BUS_BANDWIDTH` (PipeDream's
#: processes were not pinned)
GLOO_ALLREDUCE_ONE_CORE = 1.073e9

#: NCCL's all-reduce bus bandwidth (bytes/s) by level name for the DP baseline: over TCP on the Ethernet
#: levels (:data:`~pipelab.transports.NCCL_TCP_BUS_BANDWIDTH`) and as measured inside cluster A's servers
#: (:data:`~pipelab.cluster.NCCL_MEASURED_BUS_BANDWIDTH`, what ``Cluster.preset(..., transport="nccl")``
#: uses); cluster B's NVLink keeps its link rate (its DP is bound by the Ethernet)
PAPER_NCCL_BUS_BANDWIDTH: dict[str, float] = {**NCCL_TCP_BUS_BANDWIDTH,
                                              **NCCL_MEASURED_BUS_BANDWIDTH["pipedream-a"]}

#: bytes of one all-reduce call of PyTorch's DistributedDataParallel: its gradient buckets
#: (``bucket_cap_mb=25``, the default since PyTorch 1.0)
DDP_BUCKET_BYTES = 25 * 2**20


def nccl24_tree_threshold(nodes: int, ranks: int, nvlink: bool, channels: int = 1) -> float:
    """Bytes below which NCCL 2.4 all-reduces with its tree rather than its ring, by default (no
    ``NCCL_TREE_THRESHOLD``): NCCL 2.4's own model of the two (``ncclTreeThreshold``, ``src/init.cu``).

    Latency: 6 us per ring step over ``ranks - 1`` steps; the tree 15 us per level of a binary tree of
    ``nodes`` plus 4 us per rank inside a node. Bandwidth per channel: the tree at 2/3 of the ring's
    over PCIe, at 3/4 with NVLink (whose ring runs ``channels`` channels), doubled on two NVLink nodes.
    The tree is never used on one node or where the ring's latency is not the larger (0 bytes), always
    where its bandwidth is the higher (two NVLink nodes: ``inf``), else below the size at which the two
    times cross. E.g. cluster B (two 8-GPU NVLink servers): ``inf``, every bucket goes by the tree;
    cluster A (PCIe, 4 x 4): 480 kB, so DistributedDataParallel's 25 MiB buckets take the ring."""
    for label, v in (("nodes", nodes), ("ranks", ranks), ("channels", channels)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{label}={v!r} must be a positive integer")
    ring_bw = 5000.0 * (channels if nvlink else 1)          # bytes per us
    tree_bw = ring_bw * (3 / 4 if nvlink else 2 / 3)
    if nvlink and nodes == 2:
        tree_bw *= 2
    ring_lat = 6.0 * (ranks - 1)
    tree_lat = 15.0 * (nodes.bit_length() - 1) + 4.0 * (ranks // nodes - 1)
    if nodes < 2 or ring_lat <= tree_lat:
        return 0.0
    if tree_bw > ring_bw:
        return math.inf
    return ring_bw * tree_bw / (ring_bw - tree_bw) * (ring_lat - tree_lat)


#: the optimizer of PipeDream's runs per model, as the cost model names it: SGD with momentum for the image
#: models, Adam (two moments per weight: more memory, a longer step) for GNMT
PAPER_OPTIMIZERS: dict[str, str] = {"vgg16": "sgd-momentum", "resnet50": "sgd-momentum",
                                    "gnmt8": "adam", "gnmt16": "adam"}
#: ``PaperSetting.nccl_ring`` values
NCCL_RINGS = ("flat", "hierarchical", "two-server-tree")

#: the configuration PipeDream ran for each Table 1 row: a shipped PipeDream configuration, or "dp".
#: The driver configs name a config per GPU count and list cluster A's machines (v401..v407, four
#: GPUs each); cluster B's 16-GPU rows use the same 16-GPU files (no B driver config is published).
PAPER_CONFIGS: dict[str, str] = {
    "vgg16/pipedream-a/4x4": "vgg16/gpus=16/hybrid_conf",
    "vgg16/pipedream-b/2x8": "vgg16/gpus=16/hybrid_conf",
    "resnet50/pipedream-a/4x4": "dp",
    "resnet50/pipedream-b/2x8": "dp",
    "gnmt8/pipedream-a/1x4": "gnmt/gpus=4/mp_conf",
    "gnmt8/pipedream-a/3x4": "gnmt/gpus=12/mp_conf",
    "gnmt8/pipedream-b/2x8": "dp",
    "gnmt16/pipedream-a/1x4": "gnmt_large/gpus=4/mp_conf",
    "gnmt16/pipedream-a/4x4": "gnmt_large/gpus=16/mp_conf",
    "gnmt16/pipedream-b/2x8": "gnmt_large/gpus=16/mp_conf",
}


#: GNMT's vocabulary in PipeDream's profiles (both graph files: ``Embedding(32320, 1024, padding_idx=0)``)
GNMT_VOCAB = 32320


def profiled_tokens(model: str) -> int:
    """Tokens per sentence of the one batch whose activation sizes a GNMT profile records.

    PipeDream's translation profiler averages every layer's times over 101 training steps of bucketed
    batches but reads the activation sizes off one batch, the loader's first (``torchsummary`` in
    ``profiler/translation/seq2seq/train/trainer.py``). The first embedding's output of that batch is
    ``S x B x hidden`` floats, so ``S`` = its bytes / (batch x hidden x 4), the hidden size read off the
    embedding's weights (:data:`GNMT_VOCAB` x hidden floats): 48 for GNMT-8's profile, 25 for GNMT-16's."""
    prof = pipedream_profile(model)
    emb = next((layer for layer in prof.layers if layer.kind == "Embedding"), None)
    if emb is None:
        raise ValueError(f"{model!r} has no embedding layer: token counts are for the GNMT profiles")
    hidden, rest = divmod(emb.param_bytes, GNMT_VOCAB * 4)
    if rest or not hidden:
        raise ValueError(f"{model!r}: the embedding's {emb.param_bytes} bytes are not "
                         f"{GNMT_VOCAB} x hidden floats")
    return round(emb.out_bytes / (prof.batch_size * hidden * 4))


def with_activation_scale(prof: Profile, factor: float, note: str) -> Profile:
    """``prof`` with every activation byte count (outputs, saved activations, cuts, inputs, the loss's)
    scaled by ``factor`` and times and weights unchanged, e.g. a sequence model's activations at another
    sentence length than the profiled batch's; ``note`` is recorded in ``source``."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor={factor!r} must be a finite number > 0")

    def b(v: int) -> int:
        return int(round(v * factor))

    layers = tuple(replace(layer, out_bytes=b(layer.out_bytes), saved_bytes=b(layer.saved_bytes))
                   for layer in prof.layers)
    return replace(prof, layers=layers, cut_bytes=tuple(b(c) for c in prof.cut_bytes),
                   input_bytes=b(prof.input_bytes), loss_saved_bytes=b(prof.loss_saved_bytes),
                   source=f"{prof.source}; {note}" if prof.source else note)


def profiling_gpu_speed(v100_images_per_s: float = V100_RESNET50_IMAGES_PER_S) -> float:
    """A V100's speed relative to the GPU that measured PipeDream's profiles: the published V100
    throughput of ResNet-50 over the one PipeDream's ResNet-50 profile implies (batch / (fwd + bwd))."""
    prof = pipedream_profile("resnet50")
    return v100_images_per_s / (prof.batch_size / (prof.fwd_s + prof.bwd_s))


@dataclass(frozen=True)
class PaperSetting:
    """How a row is run: batch per worker, V100 speed, NCCL bus bandwidth per level, gloo's all-reduce
    rate, transports, the shape of NCCL's ring, the optimizer and how pipelab's choice is made.

    ``nccl_bus_bandwidth``: NCCL's bus bandwidth by level name for the DP baseline (None:
    :data:`PAPER_NCCL_BUS_BANDWIDTH`); a level it does not name keeps its link's rate.

    ``nccl_ring``: ``"flat"`` (default) prices the DP baseline's all-reduce as NCCL runs it, one ring
    through every rank at the slowest level's bus bandwidth (:func:`pipelab.transports.nccl_flat_ring`);
    ``"hierarchical"`` as the cost model's ring per level (the earlier model); ``"two-server-tree"``
    the flat ring except where NCCL 2.4 chose its tree for DistributedDataParallel's buckets
    (:func:`nccl24_tree_threshold`: on two NVLink servers, cluster B), whose network
    carries each byte once each way on two servers: priced as the ring per level, whose Ethernet hop
    moves ``2 (p - 1) / p = 1`` of the bytes for ``p = 2``. ``gloo_allreduce_bandwidth``: gloo's host-side
    ring rate for the replicated stages (None: :data:`~pipelab.transports.GLOO_ALLREDUCE_BUS_BANDWIDTH`).
    ``optimizer``: None for PipeDream's per model (:data:`PAPER_OPTIMIZERS`). ``activation_tokens``:
    for a GNMT model, the sentence length its activation bytes are scaled to from the profiled batch's
    (:func:`profiled_tokens`; None: as profiled). ``pcie_v100_factor``: cluster A's V100 PCIe cards' speed
    over the SXM2 modules' that ``device_speed`` describes (:data:`V100_PCIE_OVER_SXM2`; a dict: per model),
    applied by :meth:`speed_of`. ``choose``:
    ``"simulate"`` (default) takes, of the partitioner's plan, the best straight pipeline and DP, the one
    the simulator finds fastest; ``"predict"`` keeps the partitioner's plan unless DP is predicted at
    least as fast (the earlier rule)."""

    batch_size: int = PAPER_BATCH
    device_speed: float | None = None           # None: profiling_gpu_speed() (a V100 SXM2's)
    nccl_bus_bandwidth: dict[str, float] | None = None   # None: PAPER_NCCL_BUS_BANDWIDTH
    transports: str = "pipedream"               # "pipedream" (gloo pipelines, NCCL DP) | "link"
    nccl_ring: str = "flat"                     # "flat" (NCCL's) | "hierarchical" | "two-server-tree"
    choose: str = "simulate"                    # "simulate" | "predict"
    gloo_allreduce_bandwidth: float | None = None   # None: GLOO_ALLREDUCE_BUS_BANDWIDTH
    optimizer: str | None = None                # None: PipeDream's per model (PAPER_OPTIMIZERS)
    activation_tokens: dict[str, int] | None = None  # model -> tokens per sentence of its activation bytes
    pcie_v100_factor: float | dict[str, float] = V100_PCIE_OVER_SXM2   # cluster A's V100 PCIe / SXM2

    def __post_init__(self) -> None:
        f = self.pcie_v100_factor
        for v in (f.values() if isinstance(f, dict) else (f,)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"pcie_v100_factor={f!r}: the V100 PCIe card's speed over the SXM2 module's "
                                 "must be a finite number > 0 (or a dict of them by model)")

    def speed(self) -> float:
        """The device speed used."""
        return profiling_gpu_speed() if self.device_speed is None else float(self.device_speed)

    def speed_of(self, row: PaperRow) -> float:
        """The devices' speed on ``row``'s cluster: :meth:`speed` (a V100 SXM2's: cluster B), times
        ``pcie_v100_factor`` on cluster A, whose V100s are PCIe cards (a dict: per model, 1 for one it
        does not name)."""
        f = self.pcie_v100_factor
        if row.cluster != "pipedream-a":
            return self.speed()
        return self.speed() * float(f.get(row.model, 1.0) if isinstance(f, dict) else f)

    def optimizer_of(self, model: str) -> str:
        """The optimizer a row of ``model`` trains with."""
        return self.optimizer if self.optimizer is not None else PAPER_OPTIMIZERS.get(model, "sgd-momentum")

    def clusters(self, row: PaperRow) -> tuple[Cluster, Cluster]:
        """(the pipelined runs' cluster, the data-parallel baseline's cluster) for ``row``."""
        base = Cluster.preset(row.cluster, servers=row.servers, gpus_per_server=row.gpus_per_server,
                              speed=self.speed_of(row))
        if self.transports == "link":
            return base, base
        if self.transports != "pipedream":
            raise ValueError(f"transports={self.transports!r} must be 'pipedream' or 'link'")
        bus = PAPER_NCCL_BUS_BANDWIDTH if self.nccl_bus_bandwidth is None else self.nccl_bus_bandwidth
        dp = base.with_transport("link", "nccl-ring", allreduce_bus_bandwidth=bus)
        if self.nccl_ring not in NCCL_RINGS:
            raise ValueError(f"nccl_ring={self.nccl_ring!r} must be one of {NCCL_RINGS}")
        nvlink = base.levels[0].name.startswith("nvlink")
        tree = (self.nccl_ring == "two-server-tree" and row.servers == 2
                and nccl24_tree_threshold(row.servers, base.num_workers, nvlink) > DDP_BUCKET_BYTES)
        if self.nccl_ring != "hierarchical" and not tree:
            dp = replace(dp, name=dp.name + "[flat]", levels=nccl_flat_ring(dp.levels))
        gloo = GLOO_ALLREDUCE_BUS_BANDWIDTH if self.gloo_allreduce_bandwidth is None \
            else float(self.gloo_allreduce_bandwidth)
        return base.with_transport("gloo-host", "gloo-ring", gloo_allreduce_bandwidth=gloo), dp

    def profile(self, model: str) -> Profile:
        """PipeDream's profile of ``model`` at this batch size (and ``activation_tokens``' length)."""
        prof = pipedream_profile(model).at_batch_size(self.batch_size)
        tokens = (self.activation_tokens or {}).get(model)
        if tokens is None:
            return prof
        was = profiled_tokens(model)
        return with_activation_scale(prof, tokens / was, f"activations scaled from {was} to {tokens} tokens "
                                                           f"per sentence")


def _dynamic_program(prof: Profile, pipe_cl: Cluster, optimizer: str, *, straight: bool = False,
                     memory_limit: float | None = None) -> Plan | None:
    """PipeDream's dynamic program on the pipelined runs' cluster (``straight``: its best straight
    pipeline); None where no plan fits."""
    limit: dict[str, Any] = {} if memory_limit is None else {"memory_limit": memory_limit}
    try:
        return partition(prof, pipe_cl, method="pipedream", straight=straight, optimizer=optimizer, **limit)
    except ValueError:
        return None


def choose_plan(prof: Profile, pipe_cl: Cluster, dp_cl: Cluster, *, memory_limit: float | None = None,
                optimizer: str = "sgd-momentum", plan: Plan | None = None) -> tuple[Plan, Plan, bool]:
    """pipelab's choice for a row: ``(chosen, dp, is_dp)``. PipeDream's dynamic program on the pipelined
    runs' cluster (``plan``, where the caller has it); data parallelism (on its own, NCCL, cluster) instead
    when it is predicted faster."""
    dp = partition(prof, dp_cl, method="dp", memory_limit=math.inf, optimizer=optimizer)
    if plan is None:
        plan = _dynamic_program(prof, pipe_cl, optimizer, memory_limit=memory_limit)
    if plan is None or plan.num_stages == 1 or plan.time_per_minibatch >= dp.time_per_minibatch:
        return dp, dp, True
    return plan, dp, False


def choose_simulated(prof: Profile, pipe_cl: Cluster, dp: Plan, sim_dp: float,
                     sim_time: Callable[[Plan], float], *, optimizer: str = "sgd-momentum",
                     plan: Plan | None = None) -> tuple[Plan, float, bool]:
    """pipelab's choice by simulation, as its planner ranks candidates (``pl.plan``: closed forms to
    prune, the simulator to rank): of PipeDream's dynamic program's plan, the best straight pipeline
    (PipeDream's optimizer's ``--straight_pipeline``) and data parallelism, the fastest simulated.
    ``plan``: the dynamic program's plan, where the caller has it (computed here otherwise).
    Returns ``(plan, simulated seconds per minibatch, is_dp)``; ties go to DP, then to the DP's plan."""
    best: tuple[Plan, float, bool] = (dp, float(sim_dp), True)
    for straight in (False, True):
        cand = plan if (plan is not None and not straight) else _dynamic_program(prof, pipe_cl, optimizer,
                                                                                  straight=straight)
        if cand is None or cand.num_stages == 1:
            continue
        t = sim_time(cand)
        if t < best[1]:
            best = (cand, t, False)
    return best


def paper_plan(row: PaperRow, prof: Profile, pipe_cl: Cluster, *, optimizer: str = "sgd-momentum"
               ) -> Plan | None:
    """The configuration PipeDream ran for ``row`` as a pipelab plan on the pipelined cluster (``None``
    for data parallelism)."""
    name = PAPER_CONFIGS.get(row.key, "dp")
    if name == "dp":
        return None
    return plan_from_pipedream(prof, name, CostModel(prof, pipe_cl, optimizer=optimizer))


def _sim_s(plan: Plan, prof: Profile, cluster: Cluster, minibatches: int, optimizer: str) -> float:
    """Simulated seconds per minibatch of ``plan`` on ``cluster``."""
    return float(simulate_plan(plan, prof, cluster, minibatches=minibatches,
                               optimizer=optimizer).time_per_minibatch)


def row_choice(prof: Profile, pipe_cl: Cluster, dp_cl: Cluster, setting: PaperSetting, *,
               minibatches: int = 64, optimizer: str | None = None
               ) -> tuple[Plan, Plan, bool, float, float]:
    """pipelab's choice for a row as ``setting.choose`` says: ``(chosen, dp, is_dp, simulated seconds
    per minibatch of the chosen plan, of DP)``; every plan trains with ``optimizer`` (None: the
    setting's for the profile's model, :meth:`PaperSetting.optimizer_of`)."""
    if optimizer is None:
        optimizer = setting.optimizer_of(prof.model)
    # the dynamic program's plan once, for the prediction's choice and the simulation's candidates
    plan = _dynamic_program(prof, pipe_cl, optimizer)
    chosen, dp, is_dp = choose_plan(prof, pipe_cl, dp_cl, optimizer=optimizer, plan=plan)
    sim_dp = _sim_s(dp, prof, dp_cl, minibatches, optimizer)

    def sim_time(plan: Plan) -> float:
        return _sim_s(plan, prof, pipe_cl, minibatches, optimizer)

    if setting.choose == "simulate":
        chosen, t_chosen, is_dp = choose_simulated(prof, pipe_cl, dp, sim_dp, sim_time, optimizer=optimizer,
                                                   plan=plan)
    elif setting.choose == "predict":
        t_chosen = sim_dp if is_dp else sim_time(chosen)
    else:
        raise ValueError(f"choose={setting.choose!r} must be 'simulate' or 'predict'")
    return chosen, dp, is_dp, t_chosen, sim_dp


def simulate_row(row: PaperRow, setting: PaperSetting = PaperSetting(), *, minibatches: int = 64
                 ) -> dict[str, Any]:
    """One Table 1 row as PipeDream ran it, simulated: pipelab's choice and the paper's configuration,
    each over data parallelism on the same GPUs (NCCL), beside the paper. Deterministic."""
    prof = setting.profile(row.model)
    pipe_cl, dp_cl = setting.clusters(row)
    opt = setting.optimizer_of(row.model)
    chosen, dp, is_dp, t_chosen, sim_dp = row_choice(prof, pipe_cl, dp_cl, setting, minibatches=minibatches)
    pp = paper_plan(row, prof, pipe_cl, optimizer=opt)
    t_paper = sim_dp if pp is None else (t_chosen if (not is_dp and pp.config == chosen.config
                                                       and _same_bounds(pp, chosen))
                                         else _sim_s(pp, prof, pipe_cl, minibatches, opt))
    out: dict[str, Any] = {
        "model": row.model, "cluster": row.cluster, "servers_x_gpus": f"{row.servers}x{row.gpus_per_server}",
        "batch_size": prof.batch_size, "optimizer": opt, "device_speed": round(setting.speed_of(row), 3),
        "config": chosen.config, "stages": chosen.num_stages,
        "predicted_speedup": round(dp.time_per_minibatch / chosen.time_per_minibatch, 3),
        "simulated_speedup": round(sim_dp / t_chosen, 3),
        "paper_config_name": PAPER_CONFIGS.get(row.key, ""),
        "paper_config_as_run": (pp.config if pp is not None else str(dp_cl.num_workers)),
        "paper_config_simulated_speedup": round(sim_dp / t_paper, 3),
        "paper_config": row.config, "paper_speedup": row.speedup,
        "sim_plan_ms": round(t_chosen * 1e3, 2), "sim_dp_ms": round(sim_dp * 1e3, 2),
        "sim_paper_config_ms": round(t_paper * 1e3, 2),
    }
    if row.speedup:
        err = sim_dp / t_chosen / row.speedup - 1.0
        perr = sim_dp / t_paper / row.speedup - 1.0
        shape = config_shape(chosen.config) == config_shape(row.config)
        out.update(error=round(err, 3), shape_matches=shape, within_25pct=abs(err) <= 0.25,
                   paper_config_error=round(perr, 3), paper_config_within_25pct=abs(perr) <= 0.25)
    return out


def _same_bounds(a: Plan, b: Plan) -> bool:
    def key(p: Plan) -> list[tuple[int, int, int]]:
        return [(s.start, s.end, s.replicas) for s in p.stages]

    return key(a) == key(b)


def predicted_row(row: PaperRow, setting: PaperSetting) -> dict[str, Any]:
    """The partitioner's prediction for a row (no simulation; what the sensitivity grid uses)."""
    prof = setting.profile(row.model)
    pipe_cl, dp_cl = setting.clusters(row)
    chosen, dp, _ = choose_plan(prof, pipe_cl, dp_cl, optimizer=setting.optimizer_of(row.model))
    sp = dp.time_per_minibatch / chosen.time_per_minibatch
    err = sp / row.speedup - 1.0 if row.speedup else float("nan")
    shape = config_shape(chosen.config) == config_shape(row.config)
    return {"key": row.key, "config": chosen.config, "predicted_speedup": round(sp, 3),
            "error": round(err, 3), "shape_matches": shape, "ok": shape and abs(err) <= 0.25}


#: the sensitivity grid: V100 speeds over the profiling GPU (besides the cited one), and multiples of the
#: cited NCCL bus bandwidths
SENSITIVITY_SPEEDS = (1.0, 1.75, 2.5, 4.0)
SENSITIVITY_NCCL_SCALES = (0.5, 0.75, 1.0, 1.25, 1.5)


def sensitivity(speeds: Sequence[float] | None = None, nccl_scales: Sequence[float] = SENSITIVITY_NCCL_SCALES,
                *, rows: Sequence[PaperRow] = TABLE1, batch_size: int = PAPER_BATCH,
                minibatches: int = 64) -> list[dict[str, Any]]:
    """Every row over a grid of the two unknowns, simulated as :func:`simulate_row` does: the V100's
    speed relative to the profiling GPU and NCCL's bus bandwidth over TCP as a multiple of the cited one
    (both Ethernet levels scaled alike; inside a server it stays at :data:`PAPER_NCCL_BUS_BANDWIDTH`'s).
    ``ok``: pipelab's choice has the paper's shape and is within 25%; ``paper_config_ok``: the paper's
    configuration is within 25%. The default cell is the table."""
    if speeds is None:
        speeds = sorted({*SENSITIVITY_SPEEDS, profiling_gpu_speed()})
    out = []
    for speed in speeds:
        for scale in nccl_scales:
            tcp = {k: v * scale for k, v in NCCL_TCP_BUS_BANDWIDTH.items()}
            bus = {**PAPER_NCCL_BUS_BANDWIDTH, **tcp}
            setting = PaperSetting(batch_size=batch_size, device_speed=speed, nccl_bus_bandwidth=bus)
            for row in rows:
                r = simulate_row(row, setting, minibatches=minibatches)
                out.append({"device_speed": speed, "nccl_scale": scale, "key": row.key,
                            "config": r["config"], "simulated_speedup": r["simulated_speedup"],
                            "error": r["error"], "shape_matches": r["shape_matches"],
                            "ok": r["shape_matches"] and r["within_25pct"],
                            "paper_config_error": r["paper_config_error"],
                            "paper_config_ok": r["paper_config_within_25pct"]})
    return out


#: cited alternatives to the defaults' terms, each simulated over the whole table (:func:`alternatives`):
#: name -> (how it differs from the defaults, its source, the setting)
ALTERNATIVES: dict[str, tuple[str, str, PaperSetting]] = {
    "defaults": ("the cited defaults", "README", PaperSetting()),
    "gloo-one-core": (
        "the replicated stages' gloo all-reduce at one pinned core's rate, 1.07 GB/s, not gloo's 2.83 GB/s",
        "pytorch/gloo issue #248 (2020)", PaperSetting(gloo_allreduce_bandwidth=GLOO_ALLREDUCE_ONE_CORE)),
    "nccl-tree-two-servers": (
        "DP's all-reduce on two servers as NCCL 2.4's tree (the network carries each byte once each way), "
        "not the flat ring", "NCCL 2.4 src/init.cu (ncclTreeThreshold); NVIDIA/nccl #235, #946",
        PaperSetting(nccl_ring="two-server-tree")),
    "gnmt8-at-25-tokens": (
        "GNMT-8's activation bytes at 25 tokens per sentence (GNMT-16's profiled batch), not its profiled "
        "batch's 48; times unchanged (both are means over 101 batches)",
        "profiler/translation/seq2seq/train/trainer.py; the two profiles' embedding outputs",
        PaperSetting(activation_tokens={"gnmt8": 25})),
    "gloo-one-core+gnmt8-at-25-tokens": (
        "gloo-one-core and gnmt8-at-25-tokens together", "as those two",
        PaperSetting(gloo_allreduce_bandwidth=GLOO_ALLREDUCE_ONE_CORE, activation_tokens={"gnmt8": 25})),
    "pcie-link-rate": (
        "DP's NCCL all-reduce inside a cluster-A server at the PCIe link's 10 GB/s (the earlier default), "
        "not the 6.88 GB/s measured on Azure NCv3", "the cluster preset's PCIe link rate",
        PaperSetting(nccl_bus_bandwidth=dict(NCCL_TCP_BUS_BANDWIDTH))),
    "v100-sxm2-on-a": (
        "cluster A's V100s at the SXM2 module's speed (the earlier default), not the PCIe card's 14/15.7",
        "the DGX-1 throughput the speed is cited from", PaperSetting(pcie_v100_factor=1.0)),
    "v100-pcie-launch-spec": (
        "cluster A's V100 PCIe at 14/15 of the SXM2's, the modules' launch FP32 peak (15 TFLOPS at "
        "1455 MHz), not the datasheet's 14/15.7", "NVIDIA's V100 announcement (2017)",
        PaperSetting(pcie_v100_factor=14 / 15)),
    "v100-pcie-tbd": (
        "cluster A's V100 PCIe at TBD's measured single-GPU FP32 training speeds: image classification about "
        "15% below the SXM2's, translation (LSTM) at par",
        "TBD benchmark suite (U. Toronto), Hardware Sensitivity",
        PaperSetting(pcie_v100_factor={"vgg16": 0.85, "resnet50": 0.85, "gnmt8": 1.0, "gnmt16": 1.0})),
    "sgd-for-gnmt": (
        "GNMT trained with momentum SGD (pipelab's earlier choice), not PipeDream's Adam",
        "runtime/translation/main_with_runtime.py", PaperSetting(optimizer="sgd-momentum")),
}


def alternatives(names: Sequence[str] | None = None, *, rows: Sequence[PaperRow] = TABLE1,
                 minibatches: int = 64) -> list[dict[str, Any]]:
    """Every row under each cited alternative of :data:`ALTERNATIVES` (all of them by default), simulated
    as :func:`simulate_row` does: one record per (alternative, row) with pipelab's choice, its error,
    whether it counts for the goal (``ok``: the paper's shape, within 25%) and the paper configuration's
    error. The ``"defaults"`` records are the table."""
    out = []
    for name in (ALTERNATIVES if names is None else names):
        if name not in ALTERNATIVES:
            raise ValueError(f"unknown alternative {name!r}; choose from {', '.join(ALTERNATIVES)}")
        what, source, setting = ALTERNATIVES[name]
        for row in rows:
            r = simulate_row(row, setting, minibatches=minibatches)
            out.append({"alternative": name, "what": what, "source": source, "key": row.key,
                        "config": r["config"], "simulated_speedup": r["simulated_speedup"],
                        "paper_speedup": row.speedup, "error": r["error"],
                        "ok": bool(r["shape_matches"] and r["within_25pct"]),
                        "paper_config_error": r["paper_config_error"],
                        "paper_config_ok": bool(r["paper_config_within_25pct"]),
                        "sim_dp_ms": r["sim_dp_ms"], "sim_plan_ms": r["sim_plan_ms"]})
    return out


def alternatives_markdown(df: pd.DataFrame) -> str:
    """:func:`alternatives`' records as markdown: per alternative, rows within 25% with the paper's shape
    (and the paper's configurations within 25%), then each row's error under each alternative."""
    names = list(dict.fromkeys(df["alternative"]))
    lines = ["| alternative | what differs from the defaults | source | rows (paper's configurations) |",
             "|---|---|---|---|"]
    for name in names:
        part = df[df["alternative"] == name]
        lines.append(f"| {name} | {part['what'].iloc[0]} | {part['source'].iloc[0]} | "
                     f"{int(part['ok'].sum())} ({int(part['paper_config_ok'].sum())}) |")
    lines += ["", "| row | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key in dict.fromkeys(df["key"]):
        cells = []
        for name in names:
            r = df[(df["alternative"] == name) & (df["key"] == key)].iloc[0]
            cells.append(f"{float(r['error']):+.0%} ({r['config']})")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def default_wire_fractions() -> dict[str, float]:
    """The cited defaults as fractions of wire speed (10 Gbps: 0.6; 25 Gbps: 1.7 GB/s of 3.125)."""
    return {"ethernet-10g": NCCL_TCP_BUS_BANDWIDTH["ethernet-10g"] / (10e9 / 8),
            "ethernet-25g": NCCL_TCP_BUS_BANDWIDTH["ethernet-25g"] / (25e9 / 8)}


def sensitivity_grid(df: pd.DataFrame, column: str = "ok"
                     ) -> tuple[list[float], list[float], list[list[int]], tuple[int, int]]:
    """From :func:`sensitivity`'s rows: (speeds, NCCL scales, rows passing ``column`` per grid cell,
    the default cell's (row, column))."""
    speeds = sorted(set(float(v) for v in df["device_speed"]))
    scales = sorted(set(float(v) for v in df["nccl_scale"]))
    ok = df.groupby(["device_speed", "nccl_scale"])[column].sum()
    grid = [[int(ok.loc[(s, c)]) for c in scales] for s in speeds]
    d_speed = profiling_gpu_speed()
    i = min(range(len(speeds)), key=lambda k: abs(speeds[k] - d_speed))
    j = min(range(len(scales)), key=lambda k: abs(scales[k] - 1.0))
    return speeds, scales, grid, (i, j)


def sensitivity_svg(df: pd.DataFrame) -> str:
    """The sensitivity heatmap (rows within 25% with the paper's shape), the default outlined."""
    speeds, scales, grid, mark = sensitivity_grid(df)
    return svg_heatmap(grid, xs=[f"{c:g}x" for c in scales], ys=[f"{s:.3g}" for s in speeds],
                       xlabel="NCCL bus bandwidth over TCP, multiple of the cited one",
                       ylabel="V100 speed / profiling GPU", mark=mark, vmax=10,
                       title="Table 1 rows with the paper's shape and within 25% (of 10), simulated")


def sensitivity_markdown(df: pd.DataFrame) -> str:
    """The heatmap as a markdown table, each cell "pipelab's choice (the paper's configuration)", the
    default cell in bold, then each row's error at the default and at the grid's corners."""
    speeds, scales, grid, (mi, mj) = sensitivity_grid(df)
    _, _, pgrid, _ = sensitivity_grid(df, "paper_config_ok")
    lines = ["| V100 speed \\ NCCL bus bw | " + " | ".join(f"{c:g}x" for c in scales) + " |",
             "|---|" + "---|" * len(scales)]
    for i, s in enumerate(speeds):
        cells = [f"**{v} ({pgrid[i][j]})**" if (i, j) == (mi, mj) else f"{v} ({pgrid[i][j]})"
                 for j, v in enumerate(grid[i])]
        lines.append(f"| {s:.3g} | " + " | ".join(cells) + " |")
    corners = [(speeds[mi], scales[mj]), (speeds[0], scales[0]), (speeds[0], scales[-1]),
               (speeds[-1], scales[0]), (speeds[-1], scales[-1])]
    lines += ["", "Each row's simulated error (pipelab's choice) at the default and at the grid's corners:",
              "",
              "| row | " + " | ".join(f"speed {s:.3g}, NCCL {c:g}x" for s, c in corners) + " |",
              "|---|" + "---|" * len(corners)]
    for key in dict.fromkeys(df["key"]):
        part = df[df["key"] == key].set_index(["device_speed", "nccl_scale"])
        cells = []
        for s, c in corners:
            r = part.loc[(s, c)]
            cells.append(f"{float(r['error']):+.0%} ({r['config']})")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
