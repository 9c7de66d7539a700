"""Step one of the data flow: a model (or PipeDream's graph.txt) becomes a :class:`Profile`.

``pl.profile(model, sample)`` is the profiler (:func:`pipelab.profile.measure.profile`); this package
is made callable as that function by ``pipelab/__init__.py``, since importing any of its modules
binds the package itself to the name ``pipelab.profile``.
"""

from pipelab.profile.records import Layer, Profile, RangeTotals

__all__ = ["Layer", "Profile", "RangeTotals"]
