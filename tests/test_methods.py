"""The method registry (pipelab.methods): every key has its implementation, every method builds a
valid schedule, and an unknown method or option gets the same error everywhere."""

from __future__ import annotations

import pytest

import pipelab as pl
import pipelab.methods as methods
from pipelab.cluster import Cluster
from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile
from pipelab.runtime.policies import POLICIES, policy_for, supported_methods
from pipelab.schedules import BUILDERS, build, validate
from pipelab.schedules.versions import VERSION_RULES
from pipelab.sim import simulate


def _schedule_options(m: methods.Method) -> dict[str, int]:
    """Values for a method's required options (chunks=2)."""
    return {o.name: 2 for o in m.options if o.required}


def test_every_key_has_exactly_one_implementation():
    orders = {m.order for m in methods.METHODS.values()}
    weights = {m.weights for m in methods.METHODS.values()}
    rules = {m.versions for m in methods.METHODS.values()}
    assert orders == set(BUILDERS)          # no builder without a method, no method without a builder
    assert weights == set(POLICIES)
    assert rules <= set(VERSION_RULES)
    assert set(supported_methods()) == set(methods.names())


@pytest.mark.parametrize("name", methods.names())
def test_every_method_builds_and_validates(name):
    m = methods.get(name)
    plan: Plan | int = Plan.from_boundaries(4, [1, 2], [1, 1, 1])
    if m.order == "dp":
        plan = Plan.from_boundaries(4, [], [2])
    elif _schedule_options(m) or m.stages_per_worker != 1:   # an int P gets v * P virtual stages
        plan = 3
    if m.order == "dualpipe":      # P even: worker s pairs with worker P-1-s
        plan = Plan.from_boundaries(4, [1, 2, 3], [1, 1, 1, 1])
    mb = {"microbatches": 8} if m.order in ("dualpipe", "dualpipev") else {}   # DualPipe: M >= 2P, even
    sch = build(name, plan, **_schedule_options(m), **mb)
    validate(sch)
    assert sch.method == name
    # the schedule keeps to the registry's facts: sync methods read one version per minibatch
    if m.synchronous:
        assert all(sch.version_of(w, i) == 0 for w, acts in enumerate(sch.actions)
                   for i, a in enumerate(acts) if a.kind != "U")
    # M = 1 for methods that update per microbatch
    if m.update == "microbatch":
        assert sch.microbatches == 1
    assert callable(policy_for(name, {"schedule": sch, "microbatches": sch.microbatches,
                                      **_schedule_options(m)}))


@pytest.mark.parametrize("name", methods.names())
def test_every_option_default_passes_its_own_check(name):
    m = methods.get(name)
    for o in (
        *m.options,
        *methods.COMMON_SCHEDULE_OPTIONS,
        *m.runtime_options,
        *methods.COMMON_RUNTIME_OPTIONS,
    ):
        if not o.required:
            o.check(o.default, name)


def _profile_cluster() -> tuple[Profile, Cluster]:
    return Profile.synthetic(
        [1e-3] * 4, [2e-3] * 4, out_bytes=[1000] * 4, param_bytes=[1000] * 4
    ), Cluster.flat(4)


def _errors(call) -> str:
    with pytest.raises(methods.MethodError) as info:
        call()
    return str(info.value)


def test_an_unknown_method_gets_one_message_everywhere():
    prof, cl = _profile_cluster()
    expected = f"unknown method 'nope'; choose one of {', '.join(methods.names())}"
    got = {
        "registry": _errors(lambda: methods.get("nope")),
        "schedules.build": _errors(lambda: build("nope", 2)),
        "simulate": _errors(lambda: simulate(2, prof, cl, method="nope")),
        "policy_for": _errors(lambda: policy_for("nope")),
    }
    assert set(got.values()) == {expected}, got


def test_an_unknown_option_gets_one_message_everywhere():
    prof, cl = _profile_cluster()
    m = methods.get("gpipe")
    expected = f"method 'gpipe' takes no option 'chunks'; its options: {', '.join(m.option_names)}"
    got = {
        "registry": _errors(lambda: methods.split_options(m, {"chunks": 2})),
        "schedules.build": _errors(lambda: build("gpipe", 2, chunks=2)),
        "simulate": _errors(lambda: simulate(2, prof, cl, method="gpipe", chunks=2)),
    }
    assert set(got.values()) == {expected}, got


def test_a_bad_option_value_names_the_option_and_what_to_pass():
    msg = _errors(lambda: build("hetpipe", Plan.from_boundaries(2, [1], [2, 2]), D=-1))
    assert msg.startswith("D=-1 of method 'hetpipe' must be an int >= 0")


def test_train_refuses_an_unknown_method_with_the_registry_message():
    with pytest.raises(ValueError, match=r"unknown method 'nope'; choose one of dp, gpipe"):
        pl.train(pl.models.mlp, Plan.from_boundaries(3, [1], [1, 1]), method="nope", data=lambda: [],
                 loss_fn=lambda a, b: a, optimizer=lambda p: None, steps=1, backend="local")
