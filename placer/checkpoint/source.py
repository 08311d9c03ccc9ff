"""The model a command was given: a checkpoint or GGUF (`--model`, read) or a config.json
(`--config`, estimated at the dtypes given), as one inventory."""

from __future__ import annotations

from pathlib import Path

from placer.checkpoint.experts import Inventory
from placer.errors import PlacerError


def model_inventory(model: Path | None, config: Path | None, expert_dtype: str | None = None,
                    dense_dtype: str | None = None) -> Inventory:
    """The inventory of `model`, else of `config` (one of them given: the caller's check
    says which option it takes). The dtypes are a config's: a checkpoint or GGUF names its
    own, so they are refused beside `model` rather than dropped."""
    if model is not None:
        for flag, given in (("--expert-dtype", expert_dtype), ("--dense-dtype", dense_dtype)):
            if given is not None:
                raise PlacerError(f"{flag} is for --config (a GGUF or checkpoint names its own "
                                  f"dtypes): leave {flag} out")
        from placer.checkpoint.inventory import read_inventory

        return read_inventory(model)
    assert config is not None, "model_inventory: give a model or a config"
    from placer.checkpoint.estimate import estimate_inventory

    return estimate_inventory(config, expert_dtype, dense_dtype)
