"""Schedules as data: build, print, save, load and validate per-worker action lists.

The runtime executes exactly these lists, the simulator times them and the views draw them. The
contract: docs/schedules.md.
"""

from pipelab.schedules.actions import Action, Schedule
from pipelab.schedules.builders import BUILDERS, MethodScheduleError, build
from pipelab.schedules.search import StageTimes, search_order
from pipelab.schedules.steps import ScheduleError
from pipelab.schedules.torch_format import from_torch, to_torch_csv, to_torch_order
from pipelab.schedules.validate import validate

__all__ = ["BUILDERS", "Action", "MethodScheduleError", "Schedule", "ScheduleError", "StageTimes", "build",
           "from_torch", "search_order", "to_torch_csv", "to_torch_order", "validate"]
