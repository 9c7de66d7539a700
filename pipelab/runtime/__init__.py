"""The runtime: ``train``/``launch`` run a Schedule on worker processes, or the reference executor.

Both execute exactly the Schedule ``pl.schedules.build`` returns; docs/runtime.md maps the modules.
"""

from pipelab.runtime.guards import NonFiniteError
from pipelab.runtime.launch import Run, RunResult, WorkerError, launch, train
from pipelab.runtime.policies import supported_methods

__all__ = ["NonFiniteError", "Run", "RunResult", "WorkerError", "launch", "supported_methods", "train"]
