"""The model a command was given: a checkpoint or GGUF (`--model`, read) or a config.json
(`--config`, estimated at the dtypes given), as one inventory."""

from __future__ import annotations

from pathlib import Path

from placer.checkpoint.experts import Inventory
from placer.errors import PlacerError

DTYPE_FLAGS = ("--expert-dtype", "--dense-dtype")  # a config's dtypes (a model names its own)


def model_inventory(model: Path | None, config: Path | None, expert_dtype: str | None = None,
                    dense_dtype: str | None = None) -> Inventory | None:
    """The inventory of `model`, else of `config`; None where neither is given (a command
    that needs one says so first, in its own words). The dtypes are a config's: a checkpoint
    or GGUF names its own, so they are refused beside `model`, or alone, rather than
    dropped."""
    if model is not None and config is not None:
        raise PlacerError("give --model or --config, not both")
    dtypes = [flag for flag, given in zip(DTYPE_FLAGS, (expert_dtype, dense_dtype),
                                          strict=True) if given is not None]
    if model is not None:
        if dtypes:
            raise PlacerError(f"{dtypes[0]} is for --config (a GGUF or checkpoint names its "
                              f"own dtypes): leave {dtypes[0]} out")
        from placer.checkpoint.inventory import read_inventory

        return read_inventory(model)
    if config is None:
        if dtypes:
            raise PlacerError("--expert-dtype and --dense-dtype go with --config")
        return None
    from placer.checkpoint.estimate import estimate_inventory

    return estimate_inventory(config, expert_dtype, dense_dtype)
