"""Step one of the data flow: a model (or PipeDream's graph.txt) becomes a :class:`Profile`."""

from pipelab.profile.records import Layer, Profile, RangeTotals

__all__ = ["Layer", "Profile", "RangeTotals"]
