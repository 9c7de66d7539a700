"""Partitioners: split a Profile's layers into pipeline stages for a Cluster, returning a Plan.

:func:`partition` (:mod:`.by_method`) picks one by name; each prices stages with the one cost model
(:class:`pipelab.costs.CostModel`) and ends in :mod:`.predict`, which turns stage boundaries into a
:class:`Plan` with its predictions.
"""

from pipelab.costs import CostModel
from pipelab.partition.by_method import METHODS, partition
from pipelab.partition.plan import Plan, Stage

__all__ = ["METHODS", "CostModel", "Plan", "Stage", "partition"]
