"""The CPU share (--moe-cache-cpu-share) and pinned vs mmap'd host experts in the llama.cpp
cost (solvers/llamacpp/cost.py), worked by hand on test_llamacpp_plan's tiny machine."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_llamacpp_plan import MS, steps, tiny

from solvers.llamacpp.cost import PAGEABLE_FACTOR, Setup, step_costs


def cached(**kw) -> Setup:
    return Setup("cache", np.array([True, False]), cache_mib=1, slots=(2,), **kw)


def test_no_share_until_the_cache_is_full_then_the_longer_of_cpu_and_upload():
    # slots 2: steps 0 and 1 fill them (every miss uploaded); step 2 misses with the cache
    # full: half of the miss on the CPU (its 1 ms expert, less nothing: the cpu model's
    # layer time is 1 ms expert + 1 ms hand-off, the sync is paid once) and half uploaded
    # (0.2 ms of copies + 1 ms of bytes, halved): sync + max(0.5 x 1 ms, 0.5 x 1.2 ms)
    tokens = steps([0], [1], [2], [3])
    share = step_costs(tiny(), cached(cpu_share=0.5), tokens)[:, 0]
    none = step_costs(tiny(), cached(), tokens)[:, 0]
    assert none.tolist() == pytest.approx([2.2 * MS] * 4)
    assert share.tolist() == pytest.approx([2.2 * MS, 2.2 * MS, 1.6 * MS, 1.6 * MS])


def test_a_full_share_costs_the_cpu_time_alone_and_hits_stay_free():
    tokens = steps([0], [1], [2], [2])
    share = step_costs(tiny(), cached(cpu_share=1.0), tokens)[:, 0]
    # step 2: all of the miss on the CPU, 1 ms + sync; step 3 a hit: the sync only
    assert share.tolist() == pytest.approx([2.2 * MS, 2.2 * MS, 2.0 * MS, 1.0 * MS])


def test_mmapd_host_experts_upload_slower_than_pinned_ones():
    tokens = steps([0], [1])
    pinned = step_costs(tiny(), cached(), tokens)[:, 0]
    mmapd = step_costs(tiny(), cached(pinned=False), tokens)[:, 0]
    # the bytes (1 ms at 1 MB/s pinned) at PAGEABLE_FACTOR of the bandwidth
    assert mmapd - pinned == pytest.approx([(1 / PAGEABLE_FACTOR - 1) * MS] * 2)
    given = dataclasses.replace(tiny(), pageable=(0.25e6,))
    assert step_costs(given, cached(pinned=False), tokens)[:, 0] == pytest.approx(
        [1.2 * MS + 4 * MS] * 2)


def test_an_op_offloaded_copy_is_slower_from_mmapd_experts_and_the_cpu_path_is_not():
    machine = tiny(offload_min_batch=2)
    host = np.array([True, False])
    tokens = steps([0], [0, 3])
    pinned = step_costs(machine, Setup("p", host), tokens)[:, 0]
    mmapd = step_costs(machine, Setup("m", host, pinned=False), tokens)[:, 0]
    assert mmapd[0] == pinned[0]                       # 1 token: the CPU computes it
    assert mmapd[1] == pytest.approx(pinned[1] / PAGEABLE_FACTOR)   # 2 experts copied
