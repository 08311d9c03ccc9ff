"""Hardware specs: presets load, bad specs fail naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placer.errors import PlacerError
from placer.hardware import load_spec, parse_spec, preset_names, spec_from_json

GOOD = {
    "name": "box", "cards": 2,
    "card": {"vram": "24GiB", "reserved_dense": "2GiB", "h2d_bandwidth": "25GB/s",
             "latency_us": 10},
    "link": [{"name": "s0", "cards": [0, 1], "bandwidth": "40GB/s"}],
    "decode": {"base_step_ms": {"1": 10.0, "8": 24.0}},
}


def test_presets_load_and_round_trip() -> None:
    names = preset_names()
    assert {"8x-rtx5090d-pcie5", "1x-rtx4090", "4x-rtx3090", "1x-h200"} <= set(names)
    for name in names:
        spec = load_spec(name)
        assert spec_from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_motivating_box() -> None:
    spec = load_spec("8x-rtx5090d-pcie5")
    assert len(spec.cards) == 8 and all(c.vram == 32 * 2**30 for c in spec.cards)
    assert spec.groups() == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert spec.cards[0].h2d_bandwidth == 53e9 and spec.cards[0].latency_s == pytest.approx(1e-5)


def test_base_step_interpolates() -> None:
    spec = parse_spec(GOOD)
    assert spec.base_step_s(1) == pytest.approx(0.010)
    assert spec.base_step_s(8) == pytest.approx(0.024)
    assert spec.base_step_s(4) == pytest.approx(0.016)
    assert spec.base_step_s(15) == pytest.approx(0.038)  # extrapolated from the last segment


def test_free_bytes() -> None:
    spec = parse_spec(GOOD)
    assert spec.cards[1].free_bytes == 22 * 2**30


def bad(**changes) -> dict:
    spec = json.loads(json.dumps(GOOD))
    for path, value in changes.items():
        node = spec
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[int(k)] if k.isdigit() else node[k]
        node[keys[-1]] = value
    return spec


@pytest.mark.parametrize("spec,needle", [
    (bad(card__reserved_dense="30GiB"), "cards[0].reserved_*"),
    (bad(card__h2d_bandwidth=-5.0), "cards[0].h2d_bandwidth"),
    (bad(card__h2d_bandwidth="fast"), "cards[0].h2d_bandwidth"),
    (bad(card__latency_us=-1), "cards[0].latency_us"),
    (bad(card__colour="red"), "unknown field 'colour'"),
    (bad(link__0__cards=[0, 5]), "unknown card 5"),
    (bad(link__0__bandwidth="0GB/s"), "link 's0'.bandwidth"),
    (bad(cards="eight"), "cards: expected a count"),
])
def test_bad_specs_name_the_field(spec: dict, needle: str) -> None:
    with pytest.raises(PlacerError, match=None) as err:
        parse_spec(spec, "box.toml")
    assert needle in str(err.value)


def test_hardware_cli(cli, tmp_path: Path) -> None:
    listed = cli("hardware", "list").stdout
    assert "8x-rtx5090d-pcie5" in listed
    shown = json.loads(cli("hardware", "show", "1x-rtx4090", "--json").stdout)
    assert shown["cards"][0]["vram"] == 24 * 2**30
    path = tmp_path / "bad.toml"
    path.write_text('cards = 1\n[card]\nvram = "8GiB"\nreserved_kv = "9GiB"\n'
                    'h2d_bandwidth = "10GB/s"\n')
    result = cli("hardware", "show", path, ok=False)
    assert result.exit_code == 1 and "reserved" in result.output
    result = cli("hardware", "show", "no-such-box", ok=False)
    assert result.exit_code == 1 and "unknown hardware preset" in result.output


def test_probe_without_gpu_exits_nonzero(cli) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: probe measures it instead")
    result = cli("probe", ok=False)
    assert result.exit_code == 1 and "no CUDA GPU" in result.output
