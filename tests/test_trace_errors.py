"""Bad trace directories and `traces stats` options get one line and exit 1 (issue 16)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_errors import assert_one_line_error

from traces.errors import TraceError
from traces.storing.schema import COUNTS_FILE, counts_schema
from traces.storing.writer import TraceWriter

FINGERPRINT = "0123456789abcdef"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_trace(root: Path, *, layers: tuple[int, ...] = (1, 2), num_experts: int = 8,
                k: int = 2, seqs: int = 20, tokens: int = 15, bad_expert: int | None = None
                ) -> Path:
    """A per-token trace of `seqs` sequences x `tokens` decode tokens x the MoE `layers`,
    random distinct experts per row, row groups of 200 rows (several data pages); with
    `bad_expert`, the last row selects that expert id."""
    root.mkdir(parents=True, exist_ok=True)
    meta = {"kind": "tokens", "fingerprint": FINGERPRINT, "num_layers": max(layers) + 1,
            "moe_layers": list(layers), "experts_per_layer": num_experts, "top_k": k,
            "tag": "t"}
    rng = np.random.default_rng(0)
    n = seqs * tokens * len(layers)
    experts = np.stack([rng.permutation(num_experts)[:k] for _ in range(n)])
    if bad_expert is not None:
        experts[-1, 0] = bad_expert
    path = root / "t.parquet"
    with TraceWriter(path, tag="t", top_k=k, meta=meta, row_group_rows=200) as w:
        w.write(np.repeat(np.arange(seqs), tokens * len(layers)),
                np.tile(np.repeat(np.arange(tokens), len(layers)), seqs),
                rng.integers(0, 100, n), np.ones(n, np.int32),
                np.tile(np.array(layers), seqs * tokens), experts, None)
        w.close()
    return path


def test_trace_path_that_is_a_file(cli, tmp_path: Path) -> None:
    path = write_trace(tmp_path / "tr")
    assert_one_line_error(cli("traces", "stats", path, ok=False), str(path), "not a directory")


def test_bogus_phase_is_refused(cli, tmp_path: Path) -> None:
    write_trace(tmp_path / "tr")
    assert_one_line_error(cli("traces", "stats", tmp_path / "tr", "--phase", "bogus", ok=False),
                          "'bogus'", "prefill or decode")
    assert json.loads(cli("traces", "stats", tmp_path / "tr", "--phase", "decode", "--json"
                          ).output)["layer_stats_phase"] == "decode"


def test_plot_writes_exactly_the_path_given(cli, tmp_path: Path) -> None:
    write_trace(tmp_path / "tr")
    out = tmp_path / "plots" / "Heat.PNG"
    out.parent.mkdir()
    result = cli("traces", "stats", tmp_path / "tr", "--plot", out)
    assert result.output.splitlines()[-1] == f"heatmap -> {out}"
    assert sorted(p.name for p in out.parent.iterdir()) == ["Heat.PNG"]
    assert out.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize("name", ["tr", "x.json", "dir.png", "nodir/x.png"])
def test_plot_path_refused_before_anything_is_written(cli, tmp_path: Path, name: str) -> None:
    write_trace(tmp_path / "tr")
    (tmp_path / "dir.png").mkdir()
    assert_one_line_error(cli("traces", "stats", tmp_path / "tr", "--plot", tmp_path / name,
                              ok=False), str(tmp_path / name))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.png", "tr"]
    assert not any((tmp_path / "dir.png").iterdir())


def test_heatmap_ticks_are_integers(tmp_path: Path) -> None:
    """Expert and layer axes tick whole experts and layers only (4 experts: not 0.5 steps)."""
    import matplotlib.pyplot as plt

    from traces.storing.profile import load_profile
    from traces.storing.stats import heatmap_figure

    write_trace(tmp_path / "tr", layers=(1, 2, 3), num_experts=4)
    fig = heatmap_figure(load_profile(tmp_path / "tr", phase=None))
    try:
        ax = fig.axes[0]
        xticks = [t for t in ax.get_xticks() if -0.5 <= t <= 3.5]
        assert xticks == [0, 1, 2, 3]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2", "3"]
    finally:
        plt.close(fig)


def corrupt_page(path: Path, column: str) -> None:
    """Overwrite the first data page header and body start of `column` in row group 1."""
    meta = pq.ParquetFile(path).metadata
    names = [meta.row_group(1).column(i).path_in_schema for i in range(meta.num_columns)]
    chunk = meta.row_group(1).column(next(i for i, n in enumerate(names)
                                          if n.startswith(column)))
    data = bytearray(path.read_bytes())
    start = chunk.data_page_offset
    data[start:start + 48] = bytes(b ^ 0x5A for b in data[start:start + 48])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("column", ["experts", "layer", "seq_id"])
def test_corrupt_page_is_one_line(cli, tmp_path: Path, column: str) -> None:
    path = write_trace(tmp_path / "tr")
    corrupt_page(path, column)
    assert_one_line_error(cli("traces", "stats", tmp_path / "tr", ok=False), str(path),
                          "cannot read its Parquet data")


def test_expert_id_out_of_range_is_refused(cli, tmp_path: Path) -> None:
    path = write_trace(tmp_path / "tr", bad_expert=8)
    assert_one_line_error(cli("traces", "stats", tmp_path / "tr", ok=False), str(path),
                          "expert id outside [0, 8)")


def test_unreadable_metadata_is_one_line(cli, tmp_path: Path) -> None:
    root = tmp_path / "tr"
    root.mkdir()
    schema = pa.schema([pa.field("layer", pa.int16())],
                       metadata={b"placer": b'["schema_version", 1]'})
    pq.write_table(pa.table({"layer": pa.array([0], pa.int16())}, schema=schema),
                   root / "t.parquet")
    assert_one_line_error(cli("traces", "stats", root, ok=False), "t.parquet", "metadata")


def counts_dir(root: Path, counts: list[list[int]], num_experts: int) -> Path:
    root.mkdir()
    meta = {"kind": "counts", "tag": "c", "top_k": 1, "tokens": 10,
            "num_moe_layers": 2, "num_experts": num_experts, "source": "x", "source_sha256": "0"}
    table = pa.table({"layer": pa.array(range(len(counts)), pa.int16()),
                      "counts": pa.array(counts, pa.list_(pa.int64()))},
                     schema=counts_schema(meta))
    pq.write_table(table, root / COUNTS_FILE)
    return root


def test_count_matrix_unlike_its_metadata(cli, tmp_path: Path) -> None:
    root = counts_dir(tmp_path / "c", [[5, 5], [4, 6]], num_experts=3)
    assert_one_line_error(cli("traces", "stats", root, ok=False), COUNTS_FILE, "[2, 2]", "[2, 3]")


def test_count_matrix_intact_reads(tmp_path: Path) -> None:
    from traces.storing.dataset import open_traces

    root = counts_dir(tmp_path / "c", [[5, 5], [4, 6]], num_experts=2)
    assert open_traces(root).kind == "counts"
    with pytest.raises(TraceError, match="not a directory"):
        open_traces(root / COUNTS_FILE)
