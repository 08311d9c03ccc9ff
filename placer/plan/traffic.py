"""Calibration traffic as a solve reads it: a trace set checked against the model, its
profile and its decode steps at each concurrency.

The profile's counts are streamed over every token; the steps are every token's where the set
fits a replay's bound, else those of a seeded sample of whole sequences
(traces.storing.sample), which `Traffic.sample` records and the plan's calibration reports as
`replay_sample`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from placer.checkpoint.inventory import Inventory
from placer.plan.options import DEFAULT_STEPS
from traces.errors import TraceError
from traces.storing.dataset import check_compatible, check_shape
from traces.storing.profile import (
    Profile,
    TokenSteps,
    batched_steps,
    every_token_steps,
    load_profile,
    sampled_token_steps,
    split_ids,
    split_sequences,
)
from traces.storing.sample import ReplaySample, replay_sample, sample_note


@dataclass(frozen=True)
class Traffic:
    """One calibration or evaluation traffic set: its profile and sampled steps per batch."""

    name: str
    path: Path | None
    profile: Profile | None
    steps: dict[int, TokenSteps] = field(default_factory=dict)  # B -> decode steps
    sample: ReplaySample | None = None  # the sequences replayed where not every one was

    @property
    def replayed_ids(self) -> set[int] | None:
        """The sequence ids the steps hold where they are a sample (None: every one)."""
        return None if self.sample is None else set(self.sample.seq_ids)


def traffic_steps(trace_dir: Path, profile: Profile, batch: int, num_steps: int | None,
                  seed: int, seq_ids: set[int] | None = None) -> TokenSteps:
    """The decode steps of a trace set at `batch`: every token (B = 1: each once; B > 1: one
    continuous-batching schedule that uses every token) when `num_steps` is None and the
    traces are per token; else `num_steps` sampled steps (DEFAULT_STEPS for counts)."""
    if num_steps is None and profile.per_token:
        return every_token_steps(trace_dir, batch, groupings=1, seed=seed, seq_ids=seq_ids)
    source = trace_dir if profile.per_token else profile
    return sampled_token_steps(source, batch, num_steps or DEFAULT_STEPS, seed,
                               seq_ids=seq_ids)


def load_traffic(trace_dir: Path, inv: Inventory, batches: tuple[int, ...],
                 num_steps: int | None, seed: int, seq_ids: set[int] | None = None) -> Traffic:
    """Check `trace_dir` against the model and take its decode steps at every batch."""
    trace_dir = Path(trace_dir)
    if inv.estimated:  # a config-only inventory has no real fingerprint: check shapes only
        check_shape(trace_dir, len(inv.moe_layers), inv.experts_per_layer)
    else:
        check_compatible(trace_dir, inv.fingerprint, inv.moe_layers, inv.experts_per_layer)
    profile = load_profile(trace_dir, seq_ids=seq_ids)
    sample = None
    if num_steps is None and profile.per_token:
        sample = replay_sample(trace_dir, seed, seq_ids=seq_ids)
        seq_ids = seq_ids if sample is None else set(sample.seq_ids)
    if num_steps is not None or not profile.per_token:
        steps = {b: traffic_steps(trace_dir, profile, b, num_steps, seed, seq_ids)
                 for b in batches}
    else:  # every token: read the traces once, batch the B = 1 steps (the same steps)
        single = traffic_steps(trace_dir, profile, 1, None, seed, seq_ids)
        try:
            steps = {b: single if b == 1 else batched_steps(single, b, seed) for b in batches}
        except TraceError as exc:
            raise TraceError(f"{trace_dir}: {exc}") from None
    return Traffic(profile.name or trace_dir.name, trace_dir, profile, steps, sample)


def fold_ids(t: Traffic, folds: int, seed: int) -> list[set[int]]:
    """`folds` random sets of the sequences the steps of `t` hold: every sequence of its
    trace set, or where they are a sample, the sample's."""
    if t.sample is None:
        return split_sequences(t.path, folds, seed)
    return split_ids(np.array(sorted(t.sample.seq_ids), dtype=np.int64), folds, seed,
                     f"the replay sample of {t.path}")


def sample_notes(calibration: list[dict]) -> list[str]:
    """A note for each calibration set of a plan whose steps were a replay sample."""
    return [sample_note(c["traces"], c["replay_sample"]) for c in calibration
            if c.get("replay_sample")]
