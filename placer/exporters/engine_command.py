"""The llama-server command of a plan solved with --engine llamacpp (`placer export
llamacpp`): the build it is for, the GGUF it runs (checked against the plan's model), the
option of the plan's table it takes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from placer.errors import PlacerError

if TYPE_CHECKING:
    from placer.plan.placement import Plan
    from solvers.llamacpp.builds import Build


@dataclass(frozen=True)
class EngineCommand:
    """What `export llamacpp` was asked for an --engine llamacpp plan."""

    model: Path | None
    option: str | None
    version: str | None
    devices: list[str] | None


@dataclass(frozen=True)
class ServerLine:
    """The command and what it was made of."""

    line: str
    build: Build
    chosen: dict

    def to_json(self, plan: Plan) -> dict:
        engine, chosen, build = plan.engine, self.chosen, self.build
        return {"command": self.line, "option": chosen.get("name", "chosen"),
                "host_layers": chosen["host_layers"], "n_cpu_moe": chosen["n_cpu_moe"],
                "moe_cache_mib": chosen["moe_cache_mib"], "slots": chosen["slots"],
                "cpu_share": chosen.get("cpu_share", 0.0),
                "pinned": chosen.get("pinned", True), "choice": engine["choice"],
                "tensor_split": engine.get("tensor_split"), "context": engine.get("context"),
                "devices": engine.get("devices"), "build": build.to_json(),
                "build_label": build.label}


def engine_command(plan: Plan, asked: EngineCommand) -> ServerLine:
    """The llama-server line of `plan` for `asked` (PlacerError for a build, GGUF or option
    it cannot take)."""
    from placer.exporters.llamacpp import check_model, device_names, plan_option, server_command
    from placer.plan.llamacpp import plan_build
    from solvers.errors import SolverError
    from solvers.llamacpp.builds import parse_build

    try:
        build = plan_build(plan, None if asked.version is None else parse_build(asked.version))
    except SolverError as exc:
        raise PlacerError(str(exc)) from None
    if asked.model is not None:
        check_model(plan, asked.model)
        model = str(asked.model)
    elif plan.engine.get("gguf"):
        model = plan.engine["gguf"]
    else:
        raise PlacerError("give --model MODEL.gguf: this plan was solved from a checkpoint or "
                          "config.json, and placer checks the GGUF against it")
    names = None if asked.devices is None else device_names(plan, asked.devices)
    chosen = plan_option(plan, asked.option)
    return ServerLine(server_command(plan, build, model, chosen, names), build, chosen)
