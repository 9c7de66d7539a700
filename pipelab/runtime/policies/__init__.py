"""Weight policies: which version of its weights each forward and backward of a stage reads.

:data:`POLICIES` (:mod:`.registry`) maps every :attr:`pipelab.methods.Method.weights` key to its
policy's factory (:mod:`.base`: ``single``, ``stash``, ``latest``; :mod:`.delay`; :mod:`.pipemare`;
:mod:`.wsp`). Invariant: a policy serves exactly the versions the schedule names
(:func:`pipelab.schedules.versions.assign_versions` is the one rule).
"""

from pipelab.runtime.pipemare_math import PipeMareConfig
from pipelab.runtime.policies.base import NoStash, PolicyFactory, SingleVersion, Stashing, WeightPolicy
from pipelab.runtime.policies.delay import DelayedVersions, VersionStore, delayed_sgd, delayed_version
from pipelab.runtime.policies.pipemare import PipeMarePolicy
from pipelab.runtime.policies.registry import POLICIES, policy_for, supported_methods
from pipelab.runtime.policies.wsp import HetPipePolicy, LocalWSP, WSPEndpoint

__all__ = ["POLICIES", "DelayedVersions", "HetPipePolicy", "LocalWSP", "NoStash", "PipeMareConfig",
           "PipeMarePolicy", "PolicyFactory", "SingleVersion", "Stashing", "VersionStore", "WSPEndpoint",
           "WeightPolicy", "delayed_sgd", "delayed_version", "policy_for", "supported_methods"]
