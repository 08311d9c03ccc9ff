"""How a plan and a manifest carry the cache policy's parameters (version 2 `cache_params`:
pooled slots, the learned policy's weights and calibration frequencies), read back by the
runtime's caches (`plan_caches`); version 1 plans still read."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import jsonschema
import pytest

from placer.errors import PlacerError
from placer.placed.manifest import manifest_schema
from placer.plan.placement import plan_caches, plan_from_json
from solvers.cache.learned import Learned
from tests.test_plan_check import valid_plan

WEIGHTS = [-0.5, 3.0, 1.0, 0.5, 4.0, 2.0, 0.1]
MOVES = [[[0.5, 0.1, 0.0, 0.2]] * 4] * 2  # T [2][4][4]
FREQS = [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]]


def with_cache(policy: str, params: dict | None) -> dict:
    """valid_plan with 2 slots on card 0 (one per layer) under `policy`, and `params`."""
    d = valid_plan()
    d["cards"][0].update(cache_slots=2, slot_bytes=10_000, layer_slots=[1, 1],
                         cache_policy=policy, capacity_bytes=d["cards"][0]["capacity_bytes"]
                         - 20_000)
    d["cache_params"] = params
    return d


def test_a_learned_plan_carries_its_weights_to_the_caches():
    plan = plan_from_json(with_cache("learned", {"pooled": False, "weights": WEIGHTS,
                                                 "calibration": FREQS}))
    cache = plan_caches(plan)
    assert isinstance(cache, Learned) and not cache.pooled
    assert cache.weights.tolist() == WEIGHTS
    assert cache.frequencies.tolist() == sum(FREQS, [])
    again = plan_from_json(json.loads(json.dumps(plan.to_json())))
    assert again.cache_params == plan.cache_params and again.to_json()["version"] == 2


def test_a_learned_plan_carries_weights_per_layer():
    """One set of weights per layer reaches the kernel as each layer's (layer 1's score
    here: the calibration alone, layer 0's: the age alone)."""
    per_layer = [[-1.0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1.0, 0, 0]]
    plan = plan_from_json(with_cache("learned", {"pooled": True, "weights": per_layer,
                                                 "calibration": FREQS, "transition": MOVES}))
    cache = plan_caches(plan)
    assert cache.weights.tolist() == per_layer and cache.pooled
    assert cache.params().tolist() == sum(per_layer, [])
    assert cache.transition.tolist() == MOVES
    again = plan_from_json(json.loads(json.dumps(plan.to_json())))
    assert again.cache_params == plan.cache_params


def test_pooled_is_any_policys_and_version_1_still_reads():
    pooled = plan_caches(plan_from_json(with_cache("lfuda", {"pooled": True})))
    assert pooled.name == "lfuda" and pooled.pooled
    assert pooled.partition(0, 0) == pooled.partition(0, 1) == range(0, 2)
    old = with_cache("lru", None)
    del old["cache_params"]
    old["version"] = 1
    cache = plan_caches(plan_from_json(old))
    assert cache.name == "lru" and not cache.pooled and cache.partition(0, 1) == range(1, 2)


def _v1_with_params(d: dict) -> dict:
    d["version"] = 1
    return d


BAD: dict[str, tuple[Callable[[], dict], str]] = {
    "learned without": (lambda: with_cache("learned", None),
                        "cache_params: expected the learned cache policy's weights"),
    "learned, pooled only": (lambda: with_cache("learned", {"pooled": True}),
                             "cache_params.weights: expected 7 finite numbers"),
    "short weights": (lambda: with_cache("learned", {"weights": [1, 2], "calibration": FREQS}),
                      "cache_params.weights: expected 7 finite numbers (age, decayed_4"),
    "weights of 3 layers": (lambda: with_cache("learned", {"weights": [WEIGHTS] * 3,
                                                           "calibration": FREQS}),
                            "cache_params.weights: expected 7 finite numbers (age, decayed_4, "
                            "decayed_16, decayed_64, calibration, transition, bias), or [2] "
                            "rows of them"),
    "transition shape": (lambda: with_cache("learned", {"weights": WEIGHTS, "calibration": FREQS,
                                                        "transition": MOVES[:1]}),
                         "cache_params.transition: expected null or [2][4][4] finite numbers"),
    "calibration shape": (lambda: with_cache("learned", {"weights": WEIGHTS,
                                                         "calibration": [[0.1] * 4]}),
                          "cache_params.calibration: expected [2][4] finite numbers"),
    "pooled not a bool": (lambda: with_cache("lru", {"pooled": "yes"}),
                          "cache_params.pooled: expected true or false"),
    "not an object": (lambda: with_cache("lru", [1]), "cache_params: [1] is not of type"),
    "in version 1": (lambda: _v1_with_params(with_cache("lru", {"pooled": True})),
                     "cache_params: a version 1 plan has none"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_cache_params_name_the_field(case: str):
    make, needle = BAD[case]
    with pytest.raises(PlacerError, match="^plan.json: " + re.escape(needle)):
        plan_from_json(make(), "plan.json")


def test_the_schema_takes_cache_params_and_both_versions():
    schema = manifest_schema()
    sub = {"$defs": schema.get("$defs", {}), **schema["properties"]["cache_params"]}
    jsonschema.validate({"pooled": True, "weights": WEIGHTS, "calibration": FREQS}, sub)
    jsonschema.validate({"weights": [WEIGHTS, WEIGHTS], "calibration": FREQS,
                         "transition": MOVES}, sub)
    jsonschema.validate({"weights": None}, sub)
    jsonschema.validate(None, sub)
    for bad in ([1.0], [WEIGHTS, [1.0]], [[]], WEIGHTS[:6]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"weights": bad}, sub)
    version = schema["properties"]["version"]  # 3 adds the digest: placer reads only 3
    jsonschema.validate(3, version)
    for old in (1, 2, 4):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(old, version)


def test_solve_takes_every_policy_and_auto_and_refuses_another_name():
    """solve fits the learned policy's weights on the calibration (solvers/cache/learn.py),
    so every policy is an option, and auto (the default) chooses among them."""
    from placer.plan.options import SolveOptions, check_options
    from solvers.cache_table import POLICY_NAMES

    for policy in (*POLICY_NAMES, "auto"):
        check_options(SolveOptions(offload=0.5, cache_policy=policy))
    with pytest.raises(PlacerError, match="--cache-policy must be auto or one of"):
        check_options(SolveOptions(offload=0.5, cache_policy="fifo"))
