"""benchmarks/table_ablation.py's row filter: ``source`` leaves out every row that runs that source, wrapped ones
included; ``source:op`` only that op's."""
from __future__ import annotations

from bench_scripts import load

from ucudnn.planning.table import KernelBench, Measurement
from ucudnn.problem import ConvProblem


ROWS = [Measurement(4, 1, "FMA", 1.0, 0, "legacy"),
        Measurement(4, "wino-f4", "FMA", 1.0, 0, "winograd"),
        Measurement(4, "wino-f4", "FMA", 1.0, 0, "relayout", None, {"relayout": {"source": "winograd"}})]


def _kept(drop, op):
    keep = load("table_ablation").dropper(drop)
    k = KernelBench("k", op, ConvProblem(4, 8, 8, 8, 8, 3, 3), ROWS)
    return [(m.source, m.algo) for m in ROWS if keep(k, m)]


def test_a_source_is_dropped_everywhere_it_runs():
    for op in ("forward", "backward_filter"):
        assert _kept("winograd", op) == [("legacy", 1)]


def test_a_source_op_is_dropped_for_that_op_only():
    assert _kept("winograd:backward_filter", "backward_filter") == [("legacy", 1)]
    assert _kept("winograd:backward_filter", "forward") == [(m.source, m.algo) for m in ROWS]


def test_a_source_variant_is_dropped_where_it_runs_in_the_spelling_channel_wr_takes():
    """``winograd:groups`` / ``winograd:ksplit`` / ``winograd:streams`` / ``winograd:slices``: the rows that run that
    variant of the winograd source, whatever the op (``own_sources.source_variant``, which channel_wr's
    ``--without`` uses too); other rows kept."""
    rows = [Measurement(4, 1, "FMA", 1.0, 0, "legacy"),
            Measurement(4, "wino-f4-t8-g2", "FMA", 1.0, 0, "winograd", None, {"winograd": {"tiles": 8, "groups": 2}}),
            Measurement(4, "wino-f4-t8-k4-p2", "FMA", 1.0, 0, "winograd", None,
                        {"winograd": {"tiles": 8, "ksplit": 4, "streams": 2}}),
            Measurement(4, "wino-f4-c2-s2", "FMA", 1.0, 0, "winograd", None, {"winograd": {"chunk": 2, "csplit": 2}})]
    k = KernelBench("k", "backward_filter", ConvProblem(4, 8, 8, 8, 8, 3, 3), rows)
    ablation = load("table_ablation")
    kept = {v: [m.algo for m in rows if ablation.dropper(f"winograd:{v}")(k, m)]
            for v in ("groups", "ksplit", "streams", "slices")}
    assert kept == {"groups": [1, "wino-f4-t8-k4-p2", "wino-f4-c2-s2"],
                    "ksplit": [1, "wino-f4-t8-g2", "wino-f4-c2-s2"],
                    "streams": [1, "wino-f4-t8-g2", "wino-f4-c2-s2"],
                    "slices": [1, "wino-f4-t8-g2", "wino-f4-t8-k4-p2"]}
    assert load("own_sources").source_variant("winograd:backward_filter") is None   # an op, not a variant


def test_a_source_variant_of_one_op_and_channel_slices_are_dropped_where_they_run():
    """``winograd:groups:forward``: the grouped rows of forward only (backward filter's kept); ``channels``: the rows
    of any source that compute a channel slice."""
    rows = [Measurement(4, 1, "FMA", 1.0, 0, "legacy"),
            Measurement(4, 1, "FMA", 1.0, 0, "legacy", channels=64),
            Measurement(4, "wino-f4-t8-g2", "FMA", 1.0, 0, "winograd", None, {"winograd": {"tiles": 8, "groups": 2}})]
    ablation = load("table_ablation")
    for op, kept in (("forward", [(1, None)]), ("backward_filter", [(1, None), ("wino-f4-t8-g2", None)])):
        k = KernelBench("k", op, ConvProblem(4, 8, 8, 8, 128, 3, 3), rows)
        keep = ablation.dropper("winograd:groups:forward")
        assert [(m.algo, m.channels) for m in rows if keep(k, m) and m.channels is None] == kept
        assert [m.channels for m in rows if not ablation.dropper("channels")(k, m)] == [64]


def test_offered_keeps_the_point_group_rows_the_source_measures_now():
    """VGG-16 conv4_2 forward (512 x 512, 28x28, b64): two groups of 640-tile chunks on one stream are offered, on
    three streams they are not (U under a quarter of the three streams' workspace); ungrouped rows and other
    sources' rows are always kept."""
    problem = ConvProblem(64, 512, 28, 28, 512, 3, 3, pad=1)

    def row(streams, groups):
        info = {"tiles": 640, "streams": streams, "groups": groups}
        return Measurement(64, f"wino-f4-t640-g{groups}-p{streams}", "FMA", 1.0, 0, "winograd", None,
                           {"winograd": info})

    rows = [row(1, 2), row(3, 2), row(3, 1), Measurement(64, 1, "FMA", 1.0, 0, "legacy")]
    k = KernelBench("conv4_2", "forward", problem, rows)
    offered = load("table_ablation").offered
    assert [offered(k, m) for m in rows] == [True, False, True, True]


def test_chunk_penalty_scales_chunked_winograd_rows_toward_the_one_chunk_row_of_their_micro_batch():
    from ucudnn.planning.table import BenchmarkTable

    rows = [Measurement(4, 1, "FMA", 3.0, 0, "legacy"),
            Measurement(4, "wino-f4", "FMA", 1.0, 1 << 30, "winograd"),
            Measurement(4, "wino-f4-c2", "FMA", 1.5, 1 << 20, "winograd"),     # 0.5 over its one-chunk twin
            Measurement(4, "wino-f4-t8", "FMA", 0.9, 1 << 20, "winograd"),     # faster than it: kept
            Measurement(2, "wino-f4-c1", "FMA", 0.8, 1 << 20, "winograd")]     # no one-chunk row at 2: kept
    table = BenchmarkTable("dev", 91900, [KernelBench("k", "forward", ConvProblem(4, 8, 8, 8, 8, 3, 3), rows)])
    ablation = load("table_ablation")
    half = ablation.chunk_penalty(table, 0.5)
    assert [m.time_ms for m in half.kernels[0].measurements] == [3.0, 1.0, 1.25, 0.9, 0.8]
    assert [m.time_ms for m in ablation.chunk_penalty(table, 0.0).kernels[0].measurements] == [3.0, 1.0, 1.0, 0.9, 0.8]
    assert [m.time_ms for m in table.kernels[0].measurements] == [3.0, 1.0, 1.5, 0.9, 0.8], "the input is not changed"


def test_drop_streams_plans_without_the_chunks_over_streams(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from ucudnn.planning.table import BenchmarkTable

    rows = [Measurement(4, 1, "FMA", 3.0, 0, "legacy"),
            Measurement(4, "wino-f4-t8-p2", "FMA", 1.0, 1 << 20, "winograd", None,
                        {"winograd": {"tiles": 8, "streams": 2}}),
            Measurement(4, "wino-f4-t8", "FMA", 2.0, 1 << 20, "winograd", None, {"winograd": {"tiles": 8}})]
    path = tmp_path / "t.table.json.gz"
    BenchmarkTable("dev", 91900, [KernelBench("k", "forward", ConvProblem(4, 8, 8, 8, 8, 3, 3), rows)]).save(path)
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "table_ablation.py"
    subprocess.run([sys.executable, str(script), "--table", str(path), "--drop-streams", "--limits", "64MiB",
                    "--out", str(tmp_path), "--name", "ab"], check=True, capture_output=True, text=True, timeout=120)
    got = {r["rows"]: r["planned_ms"]["64MiB"] for r in json.loads((tmp_path / "ab.json").read_text())["rows"]}
    assert got == {"all rows": 1.0, "without winograd:streams": 2.0}   # --drop-streams is --drop winograd:streams


def test_scale_prices_the_rows_of_a_source_of_one_op_and_input_height_only():
    """``--scale SOURCE[:OP][@H]=F``: those rows (wrapped ones included) cost F times their time; every other row,
    op and kernel as recorded."""
    from ucudnn.planning.table import BenchmarkTable

    small, big = ConvProblem(4, 8, 13, 13, 8, 3, 3, (1, 1)), ConvProblem(4, 8, 27, 27, 8, 3, 3, (1, 1))
    table = BenchmarkTable("dev", 91900, [KernelBench("a", "forward", small, list(ROWS)),
                                          KernelBench("b", "backward_data", small, list(ROWS)),
                                          KernelBench("c", "forward", big, list(ROWS))])
    out = load("table_ablation").scaled(table, "winograd:forward@13=0.5")
    times = {k.name: [m.time_ms for m in k.measurements] for k in out.kernels}
    assert times == {"a": [1.0, 0.5, 0.5], "b": [1.0, 1.0, 1.0], "c": [1.0, 1.0, 1.0]}
    assert [m.time_ms for m in table.kernels[0].measurements] == [1.0, 1.0, 1.0]     # the input table untouched
