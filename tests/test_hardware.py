"""Hardware specs: presets load, bad specs fail naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placer.errors import PlacerError
from placer.hardware.spec import Host, load_spec, parse_spec, preset_names, spec_from_json

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


BOX = """name = "box"
host_ram = "1GiB"
cards = 2
decode = { base_step_ms = { 1 = 0.5, 8 = 1.5 } }

[card]
vram = "1MiB"
h2d_bandwidth = "0.5GB/s"
latency_us = 5.0

[[link]]
name = "host0"
cards = [0, 1]
bandwidth = "0.8GB/s"

[host]
memory_bandwidth = "80GB/s"
flops = "1.5TFLOPS"
sync_us = 30.0
"""
DECODE = "decode = { base_step_ms = { 1 = 0.5, 8 = 1.5 } }\n"


@pytest.mark.parametrize("old,new,needle", [
    ("latency_us = 5.0", "latency_us = nan", "cards[0].latency_us: expected a finite number"),
    ('h2d_bandwidth = "0.5GB/s"', "h2d_bandwidth = inf", "cards[0].h2d_bandwidth: expected a "
     "rate"),
    ('h2d_bandwidth = "0.5GB/s"', "h2d_bandwidth = -1e9", "cards[0].h2d_bandwidth: expected a "
     "positive rate"),
    (DECODE, "", "decode: missing; give [decode] base_step_ms"),
    (DECODE, "decode = 5\n", "decode: expected a table, got 5"),
    (DECODE, "decode = { base_step_ms = 5 }\n", "decode.base_step_ms: required, a table"),
    ("1 = 0.5, 8 = 1.5", "1 = nan", "decode.base_step_ms[1]: expected a finite number > 0"),
    ("1 = 0.5, 8 = 1.5", "1 = 0.0", "decode.base_step_ms[1]: expected a finite number > 0"),
    ("1 = 0.5, 8 = 1.5", "", "decode.base_step_ms: required"),
    ("1 = 0.5, 8 = 1.5", '"1" = 0.5, "01" = 1.5', "batch 1 is given twice ('01')"),
    ("1 = 0.5, 8 = 1.5", "0 = 0.5", "batch '0' is not an integer in 1..1048576"),
    ("1 = 0.5, 8 = 1.5", "1 = 2.0, 8 = 1.5", "step time falls from 2.0 ms at batch 1"),
    ('host_ram = "1GiB"', "host_ram = -1", "host_ram: expected a size in 0..2**60 bytes"),
    ("latency_us = 5.0", 'latency_us = "5us"', "cards[0].latency_us: expected a number, got "
     "'5us'"),
    ("cards = 2", 'cards = ["x"]', "cards: expected a list of tables"),
    ("cards = 2", "cards = 1000000000", "cards: expected 1..1024 cards"),
    ('vram = "1MiB"', "vram = 1e30", "cards[0].vram: expected a size in 0..2**60 bytes"),
    ('vram = "1MiB"', 'vram = "1e400GB"', "cards[0].vram: expected a finite size"),
    ('vram = "1MiB"', "vram = true", "cards[0].vram: expected a size"),
    ("[[link]]", "[decoed]\nx = 1\n[[link]]", "box.toml: unknown field 'decoed'"),
    ("sync_us = 30.0", "sync_us = 30.0\nsockets = 0", "host.sockets: expected an integer in "
     "1..64"),
    ('flops = "1.5TFLOPS"', 'flops = "fast"', "host.flops: cannot read 'fast' as FLOP/s"),
    ('memory_bandwidth = "80GB/s"', "memory_bandwidth = nan", "host.memory_bandwidth"),
    ("sync_us = 30.0", "", "host.sync_us: missing"),
    ("sync_us = 30.0", "sync_us = -1.0", "host.sync_us: expected a finite number >= 0"),
    ("sync_us = 30.0", "sync_us = 30.0\ncores = 8", "host: unknown field 'cores'"),
    ("[host]", "host = 3\n[hostx]", "box.toml: unknown field 'hostx'"),
])
def test_bad_spec_file_is_one_line(cli, tmp_path: Path, old: str, new: str, needle: str
                                   ) -> None:
    assert old in BOX
    path = tmp_path / "box.toml"
    path.write_text(BOX.replace(old, new))
    result = cli("hardware", "show", path, ok=False)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert needle in result.stderr, result.stderr


def test_spec_file_not_utf8(cli, tmp_path: Path) -> None:
    path = tmp_path / "box.toml"
    path.write_bytes(BOX.encode().replace(b'"box"', b'"b\xffx"'))
    result = cli("hardware", "show", path, ok=False)
    assert result.exit_code == 1
    assert result.stderr == (f"error: hardware spec {path}: not UTF-8 text (byte 0xff at byte "
                             "offset 9)\n")


def test_host_table(cli, tmp_path: Path) -> None:
    path = tmp_path / "box.toml"
    path.write_text(BOX.replace("sync_us = 30.0", "sync_us = 30.0\nsockets = 2"))
    spec = load_spec(path)
    assert spec.host == Host(memory_bandwidth=80e9, flops=1.5e12, sync_s=pytest.approx(3e-5),
                             sockets=2)
    assert spec_from_json(json.loads(json.dumps(spec.to_json())), "plan.json") == spec
    shown = cli("hardware", "show", path).stdout
    assert "host CPU: 80.0 GB/s from RAM, 1.50 TFLOP/s, 30.0 us sync per layer, 2 sockets" \
        in shown
    assert json.loads(cli("hardware", "show", path, "--json").stdout)["host"] == {
        "memory_bandwidth": 80e9, "flops": 1.5e12, "sync_s": spec.host.sync_s, "sockets": 2,
        "offload_min_batch": 32, "expert": []}
    path.write_text(BOX.split("[host]")[0])
    assert load_spec(path).host is None
    assert "host CPU: not given" in cli("hardware", "show", path).stdout


@pytest.mark.parametrize("text,flops", [("800 GFLOP/s", 8e11), ("2tflops", 2e12), (5e11, 5e11),
                                        ("1e7FLOPS", 1e7)])
def test_host_flops_units(text, flops: float) -> None:
    spec = parse_spec({**GOOD, "host": {"memory_bandwidth": "60GB/s", "flops": text,
                                        "sync_us": 20}})
    assert spec.host.flops == flops and spec.host.sockets == 1


def test_every_preset_has_a_host() -> None:
    for name in preset_names():
        host = load_spec(name).host
        assert host is not None and host.memory_bandwidth >= 50e9 and host.flops >= 1e11


@pytest.mark.parametrize("change,needle", [
    (lambda d: d["cards"][0].update(latency_s=float("nan")), "hardware.cards[0].latency_s"),
    (lambda d: d["cards"][1].update(index=3), "hardware.cards[1].index: expected 1, got 3"),
    (lambda d: d.update(base_step_ms={"1": 0.0}), "hardware.base_step_ms[1]"),
    (lambda d: d.update(cards=[]), "hardware.cards: must name at least one card"),
    (lambda d: d.update(host={"memory_bandwidth": 1e9, "flops": 1e9, "sync_s": 1e-5,
                              "sockets": 1.5}), "hardware.host.sockets"),
    (lambda d: d.pop("links"), "hardware.links: missing"),
])
def test_spec_from_json_validates(change, needle: str) -> None:
    d = json.loads(json.dumps(parse_spec(GOOD).to_json()))
    change(d)
    with pytest.raises(PlacerError) as err:
        spec_from_json(d, "plan.json")
    assert str(err.value).startswith(f"plan.json: {needle}"), str(err.value)


def test_base_step_held_below_the_first_batch() -> None:
    spec = parse_spec({**GOOD, "decode": {"base_step_ms": {"4": 10.0, "8": 30.0}}})
    assert spec.base_step_s(1) == pytest.approx(0.010)
    assert spec.base_step_s(6) == pytest.approx(0.020)
