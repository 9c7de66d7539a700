"""The machine's load during a measurement (pipelab.hostload) and the verdict that reads it (metrics).

The verdict logic is checked on synthetic rounds and synthetic loads, so it does not depend on this
machine; the sampler is checked against the CPU time the kernel reports for a child process
(``resource.getrusage``), which does not depend on how busy the machine is either.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from pipelab.hostload import BUSY_SHARE, HostLoad, HostLoadSampler
from pipelab.metrics import BUSY_SPREAD, error_spread


def load(others: float, own: float = 0.5, cores: int = 2, wall: float = 10.0) -> HostLoad:
    """A synthetic load: ``others`` and ``own`` as shares of ``cores * wall``."""
    return HostLoad(wall, cores, (others + own) * cores * wall, own * cores * wall, samples=40)


def test_rounds_that_disagree_say_busy_whatever_the_load() -> None:
    rates = [100.0, 100.0 * BUSY_SPREAD * 1.1, 100.0, 100.0, 100.0]
    text = error_spread(100.0, rates)
    assert text.endswith("; the measured rate moved 1.38x between rounds, so the machine was busy: compare "
                         "again when it is quieter")
    assert text == error_spread(100.0, rates, load=load(0.0))
    both = error_spread(100.0, rates, load=load(0.6, own=0.4))   # and the load, when it held the cores
    assert both.endswith("; the measured rate moved 1.38x between rounds, so the machine was busy: other "
                         "processes took 60% of the 2 cores' time during the run (this run's processes got "
                         "40%): compare again when it is quieter")


def test_rounds_that_agree_under_a_steady_load_say_busy_with_its_share() -> None:
    rates = [50.0, 51.0, 49.5, 50.5, 50.0]           # agree: a steady load slows every round alike
    quiet = error_spread(90.0, rates, load=load(0.05))
    assert quiet.startswith("+80.0% (+76.5% .. +81.8% over 5 rounds)") and "busy" not in quiet
    busy = error_spread(90.0, rates, load=load(0.52, own=0.45))
    assert ("the machine was busy: other processes took 52% of the 2 cores' time during the run "
            "(this run's processes got 45%)") in busy
    assert "busy" not in error_spread(90.0, rates)   # no load given: only the rounds can tell


def test_the_busy_share_is_a_strict_threshold() -> None:
    at = load(BUSY_SHARE)
    assert not at.busy and load(BUSY_SHARE + 0.01).busy
    assert at.others_share == pytest.approx(BUSY_SHARE)


def test_an_unsampled_load_is_never_busy_and_says_so() -> None:
    none = HostLoad(3.0, 2, 0.0, 0.0, 0, sampled=False)
    assert not none.busy and none.others_share == 0.0 and "not sampled" in none.describe()


def test_host_load_round_trips_through_json() -> None:
    x = load(0.3)
    assert HostLoad.from_json(json.loads(json.dumps(x.to_json()))) == x


def test_a_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        HostLoadSampler(interval_s=0)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the sampler reads Linux's /proc")
def test_the_sampler_counts_a_childs_cpu_time_as_ours() -> None:
    spin = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
            "time.sleep(0.6)\n")                      # sleeps so that the last sample sees its CPU time
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with HostLoadSampler(interval_s=0.1) as sampler:
        subprocess.run([sys.executable, "-c", spin], check=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    got = sampler.result
    assert got is not None and got.sampled and got.samples >= 2
    assert got.own_core_s >= 0.8 * child - 0.05, (got, child)   # clock ticks round to 10 ms
    assert got.busy_core_s >= got.own_core_s - 0.05
    assert 0.0 <= got.others_share and 0.0 < got.own_share <= 1.0 + 1e-6


def test_start_and_stop_span_cells_and_refuse_misuse() -> None:
    sampler = HostLoadSampler(interval_s=0.05)
    with pytest.raises(RuntimeError, match="stop\\(\\) before start\\(\\)"):
        sampler.stop()
    got = sampler.start().stop()
    assert got is sampler.result and sampler.stop() is got and got.wall_s >= 0
    with pytest.raises(RuntimeError, match="already started"):
        sampler.start()
