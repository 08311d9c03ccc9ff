"""A spec says which of its figures stand in for a measurement (`estimated`) and where an
estimated step may lie (`[decode] spread`), in its TOML, in a plan's JSON, and a probe that
writes a figure drops its mark (issue 52, item 2: every estimate marked)."""

from __future__ import annotations

import json
import tomllib

import pytest
from cli_errors import assert_one_line_error
from tiny_pipeline import invoke

from placer.errors import PlacerError
from placer.hardware.spec import ESTIMABLE, load_spec, parse_spec, spec_from_json
from placer.hardware.spec_toml import spec_toml

SPEC = {
    "name": "box", "cards": 1, "estimated": ["base_step_ms", "card.h2d_bandwidth"],
    "card": {"model": "RTX 4090", "vram": "24GiB", "h2d_bandwidth": "25GB/s"},
    "decode": {"base_step_ms": {"1": 10.0, "8": 24.0}, "spread": [0.75, 1.5]},
}


def test_marks_and_spread_round_trip_through_toml_and_json() -> None:
    spec = parse_spec(SPEC)
    assert spec.estimated == ("base_step_ms", "card.h2d_bandwidth")
    assert spec.step_range_s(1) == pytest.approx((0.0075, 0.015))
    assert parse_spec(tomllib.loads(spec_toml(spec))) == spec
    assert spec_from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_a_plan_from_before_the_marks_reads_as_unmarked() -> None:
    old = json.loads(json.dumps(parse_spec(SPEC).to_json()))
    del old["estimated"], old["step_spread"]
    spec = spec_from_json(old)
    assert spec.estimated == () and spec.step_spread == (1.0, 1.0)


def test_measuring_the_step_drops_its_mark_and_spread() -> None:
    spec = parse_spec(SPEC).measured("base_step_ms")
    assert spec.estimated == ("card.h2d_bandwidth",) and spec.step_spread == (1.0, 1.0)
    assert "spread" not in spec_toml(spec) and "base_step_ms\"" not in spec_toml(spec)


@pytest.mark.parametrize("change, needle", [
    ({"estimated": ["base_step"]}, "estimated: unknown figure 'base_step'"),
    ({"estimated": "base_step_ms"}, "estimated: expected a list of figure names"),
    ({"estimated": ["base_step_ms", "base_step_ms"]}, "estimated: a figure is named twice"),
    ({"decode": {"base_step_ms": {"1": 10.0}, "spread": [1.2, 1.5]}}, "decode.spread[0]"),
    ({"decode": {"base_step_ms": {"1": 10.0}, "spread": [0.5, float("inf")]}},
     "decode.spread[1]"),
    ({"decode": {"base_step_ms": {"1": 10.0}, "spread": [0.5]}}, "decode.spread: expected"),
])
def test_bad_marks_name_the_field(change: dict, needle: str) -> None:
    with pytest.raises(PlacerError) as err:
        parse_spec({**SPEC, **change})
    assert needle in str(err.value), str(err.value)


def test_hardware_new_marks_every_figure_it_estimates(tmp_path) -> None:
    out = tmp_path / "box.toml"
    result = invoke("hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16", "--ram",
                    "ddr4-3200x2", "--out", out)
    assert result.exit_code == 0, result.output
    assert load_spec(out).estimated == tuple(ESTIMABLE)


def test_probe_step_estimate_keeps_the_mark_a_bad_file_is_one_line(tmp_path, tiny_models
                                                                    ) -> None:
    spec = tmp_path / "box.toml"
    spec.write_text(spec_toml(parse_spec(SPEC)))
    out = tmp_path / "stepped.toml"
    result = invoke("probe", "--step", "--estimate", "--model", tiny_models["qwen3_moe"],
                    "--hardware", spec,
                    "--out", out)
    assert result.exit_code == 0, result.output
    assert load_spec(out).estimated == ("base_step_ms", "card.h2d_bandwidth")
    spec.write_text(spec.read_text().replace('"card.h2d_bandwidth"', '"card.vram"'))
    assert_one_line_error(invoke("hardware", "show", spec), "unknown figure 'card.vram'")
