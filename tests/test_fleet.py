"""Traces at fleet scale: one hive-partitioned Parquet dataset (host=..., tag=...) from many
serving hosts. `placer traces stats` and `placer solve` read it in bounded memory, and DuckDB
reads the same files.

Memory is measured, not assumed: each command runs in a fresh interpreter that reports the
rise of its peak resident set (ru_maxrss) over the set it holds after imports, on a small tree
and on one with eight times the rows. Reading the large tree whole would raise the peak by at
least the bytes it decodes to; streaming it (batches of
traces.storing.dataset.BATCH_ROWS rows, a few
read ahead) must keep the difference of the two rises under half of that.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from placer.checkpoint.estimate import estimate_inventory
from traces.storing.profile import load_profile
from traces.storing.schema import KIND_TOKENS, PHASES, SEQ_ID_SHIFT
from traces.storing.writer import TraceWriter

CONFIG = Path(__file__).resolve().parent.parent / "examples" / "deepseek-v3" / "config.json"
HOSTS, TAGS = ("h0", "h1", "h2"), ("chat", "code")
SEQ_LEN = 64
SMALL, LARGE = 2_048, 16_384  # tokens per file: the large tree decodes to ~54 MiB
ROW_GROUP_ROWS = 1 << 15  # readers decode a row group at a time: keep one well under the tree
OFFSETS = np.array([0, 1, 3, 6, 10, 15, 21, 28])  # distinct mod 256: k = 8 distinct experts

PEAK_RSS = """
import os, resource, sys
from placer.cli import app
page_kib = os.sysconf("SC_PAGE_SIZE") // 1024
with open("/proc/self/statm") as f:
    before = int(f.read().split()[1]) * page_kib  # resident now, after every import
try:
    app(sys.argv[1:], prog_name="placer", standalone_mode=False)
finally:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("GROWTH_KIB", peak - before, file=sys.stderr)
"""


def write_fleet(root: Path, tokens_per_file: int, seed: int) -> Path:
    """A tree root/host=H/tag=T/T-RUN.parquet of decode rows of the DeepSeek-V3 config's model:
    each token selects 8 distinct experts per MoE layer around a Zipf-like base expert."""
    inv = estimate_inventory(CONFIG, "mxfp4")
    layers = np.asarray(inv.moe_layers)
    rng = np.random.default_rng(seed)
    for h, host in enumerate(HOSTS):
        for t, tag in enumerate(TAGS):
            run_id = 1 + h * len(TAGS) + t
            meta = {"kind": KIND_TOKENS, "fingerprint": inv.fingerprint,
                    "num_layers": inv.num_layers, "moe_layers": layers.tolist(),
                    "experts_per_layer": inv.experts_per_layer, "top_k": inv.top_k,
                    "tag": tag, "run_id": run_id}
            part = root / f"host={host}" / f"tag={tag}"
            part.mkdir(parents=True)
            writer = TraceWriter(part / f"{tag}-{run_id:08x}.parquet", tag=tag, top_k=8,
                                 meta=meta, row_group_rows=ROW_GROUP_ROWS)
            for start in range(0, tokens_per_file, 4096):
                n = min(4096, tokens_per_file - start)
                token = start + np.arange(n)
                base = (rng.zipf(1.3, (n, len(layers))) * 37 + layers * 11) % 256
                writer.write(seq_id=np.repeat((run_id << SEQ_ID_SHIFT) + token // SEQ_LEN,
                                              len(layers)),
                             pos=np.repeat(token % SEQ_LEN, len(layers)),
                             token=np.repeat(token % 1000, len(layers)),
                             phase=np.full(n * len(layers), PHASES.index("decode")),
                             layer=np.tile(layers, n),
                             experts=(base.reshape(-1, 1) + OFFSETS) % 256, weights=None)
            writer.close()
    return root


def decoded_bytes(root: Path) -> int:
    """Uncompressed bytes of every row group in the tree (what reading it whole would hold)."""
    return sum(pq.ParquetFile(f).metadata.row_group(i).total_byte_size
               for f in root.rglob("*.parquet")
               for i in range(pq.ParquetFile(f).metadata.num_row_groups))


def growth_kib(*args: object) -> tuple[int, str]:
    """(KiB the peak RSS of `placer ARGS` rose above the RSS after imports, stdout), run in a
    fresh interpreter (Linux: /proc/self/statm)."""
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, *map(str, args)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("GROWTH_KIB")][-1]
    return int(line.split()[1]), done.stdout


@pytest.fixture(scope="module")
def fleets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fleet")
    return {"small": write_fleet(root / "small", SMALL, seed=0),
            "large": write_fleet(root / "large", LARGE, seed=1)}


def test_duckdb_reads_the_tree_placer_reads(fleets: dict[str, Path]) -> None:
    tree = fleets["small"]
    glob = f"{tree}/**/*.parquet"
    per_host = dict(duckdb.sql(f"SELECT host, count(DISTINCT (seq_id, pos)) FROM read_parquet("
                               f"'{glob}', hive_partitioning = true) GROUP BY host").fetchall())
    assert per_host == {host: SMALL * len(TAGS) for host in HOSTS}
    profile = load_profile(tree)
    counts = np.zeros_like(profile.counts)
    for layer, expert, n in duckdb.sql(
            f"SELECT layer, e, count(*) FROM (SELECT layer, unnest(experts) AS e FROM "
            f"read_parquet('{glob}')) GROUP BY ALL").fetchall():
        counts[profile.moe_layers.index(layer), expert] = n
    np.testing.assert_array_equal(counts, profile.counts)


def test_stats_and_solve_read_the_tree_in_bounded_memory(fleets: dict[str, Path],
                                                          tmp_path: Path) -> None:
    large = decoded_bytes(fleets["large"])
    assert large > 48 << 20
    rises = {}
    for size, tree in fleets.items():
        stats_rise, out = growth_kib("traces", "stats", tree, "--json")
        stats = json.loads(out)
        tokens = SMALL if size == "small" else LARGE
        assert stats["tokens"] == tokens * len(HOSTS) * len(TAGS)
        assert set(stats["tags"]) == set(TAGS)
        solve_rise, _ = growth_kib("solve", "--config", CONFIG, "--expert-dtype", "mxfp4",
                                 "--hardware", "8x-rtx5090d-pcie5", "--traces", tree,
                                 "--offload", 0.5, "--solver", "greedy", "--steps", 64,
                                 "--out", tmp_path / f"plan-{size}.json")
        assert (tmp_path / f"plan-{size}.json").is_file()
        rises[size] = (stats_rise, solve_rise)
    for command, small, grown in zip(("stats", "solve"), rises["small"], rises["large"],
                                     strict=True):
        growth = (grown - small) * 1024
        assert growth < 0.5 * large, (f"{command}: peak RSS grew {growth >> 20} MiB for a tree "
                                       f"of {large >> 20} MiB decoded")
