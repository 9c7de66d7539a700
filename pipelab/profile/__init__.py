"""Step one of the data flow: a model (or PipeDream's graph.txt) becomes a :class:`Profile`.

``pl.profile(model, sample)`` is the profiler (:func:`pipelab.profile.measure.profile`). Because
importing any ``pipelab.profile.*`` module binds this *package* to the attribute ``pipelab.profile``
(Python sets a parent package's attribute for each imported child), the package itself is made
callable and forwards to the profiler, so ``pl.profile(...)`` works whatever was imported first.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from pipelab.profile.records import Layer, Profile, RangeTotals

__all__ = ["Layer", "Profile", "RangeTotals"]


class _CallablePackage(types.ModuleType):
    """Module type whose call is :func:`pipelab.profile.measure.profile`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Profile:
        from pipelab.profile.measure import profile

        return profile(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
