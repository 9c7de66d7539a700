"""One compression vocabulary: the simulator and the partitioners take the codec names ``train`` takes."""

from __future__ import annotations

import pytest

from pipelab.cluster import Cluster
from pipelab.costs import CODEC_RATIOS, compression_ratio_of
from pipelab.partition import partition
from pipelab.profile.records import Profile
from pipelab.runtime.compress import CODECS, compression_ratio
from pipelab.schedules import MethodScheduleError
from pipelab.sim import simulate


def _setup() -> tuple[Profile, Cluster]:
    P = 4
    prof = Profile.synthetic([1e-3] * P, [2e-3] * P, out_bytes=[4 * 10**6] * P, param_bytes=[10**5] * P,
                             batch_size=8)
    return prof, Cluster.flat(P, bandwidth=1e9)


def test_codec_ratios_are_the_runtimes():
    # the cost model's table is the runtime codecs' asymptotic ratio on float32 tensors
    assert set(CODEC_RATIOS) == set(CODECS)
    for codec in CODECS:
        assert CODEC_RATIOS[codec] == compression_ratio(codec)


def test_simulate_takes_codec_names_not_the_old_ratio_keyword():
    prof, cl = _setup()
    plain = simulate(4, prof, cl, method="gpipe", microbatches=4)
    int8 = simulate(4, prof, cl, method="gpipe", microbatches=4, compression="int8")
    with pytest.raises(MethodScheduleError, match="no option 'compression_ratio'"):   # the old keyword
        simulate(4, prof, cl, method="gpipe", microbatches=4, compression_ratio=4.0)
    assert int8.time_per_minibatch < plain.time_per_minibatch   # 4 MB cuts over 1 GB/s: comm matters
    assert simulate(4, prof, cl, method="gpipe", microbatches=4, compression=4.0).time_per_minibatch == \
        int8.time_per_minibatch


def test_partition_takes_codec_names():
    prof, cl = _setup()
    a = partition(prof, cl, "pipedream", compression="fp16", memory_limit=1e15)
    b = partition(prof, cl, "pipedream", compression=2.0, memory_limit=1e15)
    assert a.config == b.config and a.time_per_minibatch == b.time_per_minibatch


@pytest.mark.parametrize(
    "bad,match", [("zstd", "unknown compression 'zstd'"), (True, "codec name or a number")]
)
def test_bad_compression_is_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        compression_ratio_of(bad)
