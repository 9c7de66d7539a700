"""Whether a profile's device is the cluster's: a CPU profile priced on a GPU cluster is said once.

Compute costs the profiled seconds divided by ``cluster.speed(w)``, so a CPU profile on named GPUs at
speed 1.0 simulates GPUs at the CPU's speed: warned once per (profile device, cluster). Generic
devices and calibrated clusters are the profiled device; a synthetic profile has none.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipelab.cluster import Cluster
    from pipelab.profile.records import Profile

#: device names that stand for "the device the profile was measured on"
GENERIC_DEVICES = ("gpu", "device")

_warned: set[tuple[str, str]] = set()


def _kind(name: str) -> str:
    n = name.lower()
    return "cpu" if n.startswith("cpu") else "generic" if n in GENERIC_DEVICES else "accelerator"


def check_device(profile: Profile, cluster: Cluster) -> None:
    """Warn once when ``profile`` was measured on a CPU and ``cluster`` has accelerators, or the reverse."""
    if cluster.calibration is not None or profile.source == "synthetic":
        return
    kinds = {_kind(d.name) for d in cluster.devices} - {"generic"}
    prof_kind = "cpu" if str(profile.device).lower().startswith("cpu") else "accelerator"
    if not kinds or kinds == {prof_kind}:
        return
    key = (str(profile.device), cluster.name)
    if key in _warned:
        return
    _warned.add(key)
    names = sorted({d.name for d in cluster.devices})
    speeds = sorted({round(d.speed, 3) for d in cluster.devices})
    factor = "/".join(f"{v:g}" for v in speeds)
    same = f" (as fast as {profile.device})" if speeds == [1.0] else ""
    warnings.warn(
        f"the profile of {profile.model or 'the model'} was measured on {profile.device} but cluster "
        f"{cluster.name} has {', '.join(names)}, simulated at speed factor {factor}{same}. Set the factor, "
        f"how many times faster the cluster's device computes than {profile.device}, with "
        "Cluster.preset(name, speed=S) or profile.scaled(time=1/S), or profile on the target device",
        UserWarning, stacklevel=2)
