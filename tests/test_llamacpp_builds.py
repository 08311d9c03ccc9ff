"""`--llamacpp-version` -> the build's cache policy and flags (solvers/llamacpp/builds.py)."""

from __future__ import annotations

import pytest

from solvers.errors import SolverError
from solvers.llamacpp.builds import (
    CACHE_FLAG,
    SHARE_FLAG,
    build_from_json,
    default_build,
    parse_build,
)


@pytest.mark.parametrize(("text", "number", "policy", "flags"), [
    ("b11479", 11479, "none", ()),
    ("b11480", 11480, "lru", (CACHE_FLAG,)),
    ("b11669", 11669, "lru", (CACHE_FLAG,)),
    ("b12169", 12169, "lru", (CACHE_FLAG,)),
    ("b12170", 12170, "classlru", (CACHE_FLAG, SHARE_FLAG)),
    ("version: 0.9.0-dev (build 11669, commit 1a2b3c4)", 11669, "lru", (CACHE_FLAG,)),
    ("version: 1.0.0 (build 12300, commit b1b770d)\nbuilt with cc", 12300, "classlru",
     (CACHE_FLAG, SHARE_FLAG)),
    ("version: 6502 (abc1234)", 6502, "none", ()),
    ("v0.1.2", 10485, "none", ()),
])
def test_builds_map_to_their_policy_and_flags(text, number, policy, flags):
    build = parse_build(text)
    assert (build.number, build.policy, build.flags, build.assumed) == (number, policy, flags,
                                                                         False)


def test_a_release_from_v1_has_the_cpu_share_and_no_build_number():
    build = parse_build("v1.0.0")
    assert build.number is None and build.release == "v1.0.0"
    assert build.has_cpu_share and build.policy == "classlru"
    assert "v1.0.0" in build.label


def test_default_is_the_newest_policy_and_says_so():
    build = parse_build(None)
    assert build == default_build() == parse_build("  ")
    assert build.assumed and build.policy == "classlru" and build.has_cpu_share
    assert "assumed" in build.label and "--llamacpp-version" in build.label


@pytest.mark.parametrize("text", ["12170", "b", "b12a", "v1.0", "version 1", "latest",
                                  "v0.5.0", "version: 0.5.0-dev (build 0, commit abc)",
                                  "x" * 300])
def test_unparseable_or_unknown_versions_are_one_line_errors(text):
    with pytest.raises(SolverError) as err:
        parse_build(text)
    assert "\n" not in str(err.value) and "--llamacpp-version" in str(err.value)


def test_a_recorded_build_is_derived_again_from_what_was_given():
    forged = {"given": "b11669", "policy": "classlru", "flags": [CACHE_FLAG, SHARE_FLAG]}
    assert build_from_json(forged).flags == (CACHE_FLAG,)
    assert build_from_json(None).assumed
    assert build_from_json(parse_build("b12180").to_json()).number == 12180
    with pytest.raises(SolverError):
        build_from_json({"given": 5})
