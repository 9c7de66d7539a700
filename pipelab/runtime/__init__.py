"""The multi-process stage runtime: ``train``/``launch`` a Schedule on real processes.

``pl.train(model_fn, plan, method=..., data=..., loss_fn=..., optimizer=..., steps=...)`` runs one
process per worker (gloo on CPU, NCCL on GPUs) or, with ``backend="local"``, the single-process
reference executor; both execute exactly the Schedule that ``pl.schedules.build`` returns.

Modules: ``launch`` (processes, the Run handle, RunResult), ``worker`` (one worker's actions),
``comm`` (messages between stages), ``weights`` (weight-version policies), ``local`` (the
reference executor), ``job`` (arguments checked in the parent), ``cli`` (``pipelab train job.json``);
``buffers`` (2BW, bounded buffer, PipeMare and HetPipe policies), ``pipemare`` (its two techniques),
``wsp`` (HetPipe's parameter server), ``compress`` (fp16/bf16/int8 codecs), ``checkpoint``
(atomic per-worker checkpoints, one coordinator, a folder lock), ``options`` (runtime options:
compression, recompute, slowdown, checkpoints), ``lifeline`` (workers die with their launcher; a
loopback-only rendezvous), ``guards`` (NaN/inf losses and gradients stop a run, ``on_nonfinite``).
"""

from pipelab.runtime.guards import NonFiniteError
from pipelab.runtime.launch import Run, RunResult, WorkerError, launch, train
from pipelab.runtime.policies import supported_methods

__all__ = ["NonFiniteError", "Run", "RunResult", "WorkerError", "launch", "supported_methods", "train"]
