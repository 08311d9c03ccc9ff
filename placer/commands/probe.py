"""`placer probe`: measure the serving box (the cards' copies, the host CPU with --host, the
decode step with --step: placer/hardware/spec_probe.py), each figure saying what it measured:
the device timed, its spread over repeats, NOISY where the repeats did not settle, ESTIMATED
where nothing ran."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated

import typer

from placer.commands.common import command, parse_list, print_json
from placer.errors import PlacerError
from placer.files import check_outputs
from placer.hardware.spec_probe import (
    HostRequest,
    StepRequest,
    check_spec_out,
    probe_host_spec,
    probe_step,
)
from placer.hardware.timing import DEFAULT_TOKENS
from placer.report.hardware import print_cards, print_host, print_step


def register(app: typer.Typer) -> None:
    @command(app, "probe")
    def probe(
        json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
        host: Annotated[bool, typer.Option(
            "--host", help="Measure the host CPU instead (no GPU needed): memory bandwidth, "
            "matmul FLOP/s, cold experts' times, and the GPU round trip where CUDA is "
            "visible; print the spec's host table (or merge it into --hardware's spec at "
            "--out).")
        ] = False,
        dtype: Annotated[str, typer.Option(
            help="With --host: the experts' compute dtype, bfloat16 or float32.")
        ] = "bfloat16",
        mb: Annotated[int | None, typer.Option(
            help="With --host: copy buffer in MiB (default 4 x last-level cache, >= 256).")
        ] = None,
        tokens: Annotated[int, typer.Option(
            help="With --host: rows of the timed matmul, (tokens x 2048) @ (2048 x 768).")
        ] = 1024,
        expert: Annotated[list[str] | None, typer.Option(
            help="With --host: an expert shape HIDDENxINTER to time over n tokens, cold from "
                 "RAM (repeatable; default 2048x768, or --model's); the cpu model predicts "
                 "from these.")
        ] = None,
        expert_tokens: Annotated[str, typer.Option(
            help="With --host: the token counts n each expert is timed at.")
        ] = ",".join(map(str, DEFAULT_TOKENS)),
        step: Annotated[bool, typer.Option(
            "--step", help="Measure the decode step with every expert resident (\\[decode] "
            "base_step_ms) of --model: the model with one resident expert's shape per "
            "selection, timed on --device (which must be the spec's card to be written: see "
            "--allow-other-device); estimated from memory bandwidth where it cannot run here "
            "(marked ESTIMATED).")] = False,
        model: Annotated[Path | None, typer.Option(
            help="With --step: the checkpoint directory (or model.gguf: estimated only). With "
                 "--host: the model whose experts to time (a GGUF: its expert shape and type, "
                 "timed with llama.cpp's kernels; a checkpoint: its expert shape).")
        ] = None,
        hardware: Annotated[str | None, typer.Option(
            help="The spec (preset or .toml) to measure for: with --step its batches, its "
                 "card (the device timed must be it) and the card's memory bandwidth for an "
                 "estimate; the spec --out writes, with the measured table replaced.")
        ] = None,
        batch: Annotated[str | None, typer.Option(
            help="With --step: the batches to time (default: the spec's, else 1,8).")] = None,
        device: Annotated[str, typer.Option(
            help="With --step: torch device to time on: auto, cpu, cuda, cuda:N.")] = "auto",
        allow_other_device: Annotated[bool, typer.Option(
            "--allow-other-device", help="With --step --out: write a step timed on another "
                                         "device than the spec's card (--device cpu for a GPU "
                                         "spec), marked as such in the spec.")] = False,
        memory_bandwidth: Annotated[str | None, typer.Option(
            help="With --step: the card's memory bandwidth for an estimate (e.g. 1008GB/s; "
                 "default: the spec's card model, if placer knows it).")] = None,
        estimate: Annotated[bool, typer.Option(
            "--estimate", help="With --step: estimate from memory bandwidth, do not run.")
        ] = False,
        out: Annotated[Path | None, typer.Option(
            help="With --step or --host: write --hardware's spec with the measured table into "
                 "this .toml (it may be --hardware's own file: the spec is merged, not "
                 "appended to).")
        ] = None,
        gguf_type: Annotated[str | None, typer.Option(
            help="With --host: time the experts with llama.cpp's own CPU kernels in this GGUF "
                 "type (Q4_K, Q6_K, MXFP4, F16...: the model's expert type), as llama.cpp runs "
                 "a host layer, instead of torch (`make llama-env` installs llama.cpp).")
        ] = None,
    ) -> None:
        """Measure each visible GPU's pinned host-to-device bandwidth and per-copy latency,
        and print a spec fragment. Exits non-zero where no GPU is visible. With --host,
        measure the host CPU as it runs cold experts and print the spec's host table. With
        --step, measure the decode step of --model and print the spec's \\[decode] table.
        With --hardware SPEC --out FILE, write SPEC with the measured table in its place.
        Every figure names the device it timed and its spread over repeats (NOISY where the
        repeats did not settle)."""
        if gguf_type is not None and not host:
            raise PlacerError("--gguf-type goes with --host")
        if allow_other_device and not step:
            raise PlacerError("--allow-other-device goes with --step")
        if out is not None:
            spec = Path(hardware) if hardware and os.path.isfile(hardware) else None
            check_outputs([("--out", out)], [("the checkpoint", model), ("--hardware", spec)],
                          updates=spec)  # docs/cli.md: --hardware box.toml --out box.toml
            check_spec_out(out, hardware)
        if step:
            batches = tuple(parse_list(batch, int, "--batch")) if batch else None
            found = probe_step(StepRequest(model, hardware, batches, device, memory_bandwidth,
                                           estimate, out, allow_other_device))
            if json_out:
                print_json(found.to_json(out))
            print_step(found, out, json_out)
        elif host:
            counts = tuple(parse_list(expert_tokens, int, "--expert-tokens"))
            result = probe_host_spec(HostRequest(dtype, mb, tokens, expert, counts, model,
                                                 gguf_type, hardware, out))
            if json_out:
                print_json({**dataclasses.asdict(result), "noisy": result.noisy,
                            "out": None if out is None else str(out)})
            else:
                print_host(result, out)
        else:
            if out is not None or model is not None:
                raise PlacerError("--out and --model go with --step or --host")
            from placer.hardware.probe import probe as run_probe

            results = run_probe()
            if json_out:
                print_json([r.__dict__ for r in results])
            else:
                print_cards(results)
