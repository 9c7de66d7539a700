"""The planner: which method, partition, microbatches and options to run on a cluster, within memory.

:func:`plan` (:mod:`.search`) ranks candidates into a :class:`PlanTable`; :mod:`.decide` picks a row
within the simulator's error; :func:`confirm` (:mod:`.confirmation`) measures a table's shortlist.
"""

from pipelab.planner.confirmation import Confirmed, ConfirmOptions, confirm
from pipelab.planner.decide import NO_MARGIN, decide, load_margin, margin_from_accuracy
from pipelab.planner.search import COLUMNS, DEFAULT_METHODS, Candidate, PlanTable, plan

__all__ = ["COLUMNS", "DEFAULT_METHODS", "NO_MARGIN", "Candidate", "ConfirmOptions", "Confirmed", "PlanTable",
           "confirm", "decide", "load_margin", "margin_from_accuracy", "plan"]
