"""benchmarks/own_sources.py's "without" table: the same measurements with the new sources taken out, wrapped
ones included (a relayout or fold row that runs mec inside is a mec row), so NCHW comparisons through relayout
compare what they claim to."""
from __future__ import annotations

from bench_scripts import load

from ucudnn.planning.table import BenchmarkTable, KernelBench, Measurement
from ucudnn.problem import ConvProblem


def test_rows_that_run_a_left_out_source_inside_a_wrapper_are_left_out_too():
    own = load("own_sources")
    rows = [Measurement(4, 1, "FMA", 1.0, 0, "legacy"),
            Measurement(4, "mec-A", "FMA", 1.0, 0, "mec"),
            Measurement(4, 1, "FMA", 1.0, 0, "relayout", None, {"relayout": {"source": "legacy"}}),
            Measurement(4, "mec-A", "FMA", 1.0, 0, "relayout", None, {"relayout": {"source": "mec"}}),
            Measurement(4, "mec-A", "FMA", 1.0, 0, "fold", None,
                        {"fold": {"source": "relayout"}, "relayout": {"source": "mec"}})]
    assert [own.chain(m) for m in rows] == [["legacy"], ["mec"], ["relayout", "legacy"], ["relayout", "mec"],
                                            ["fold", "relayout", "mec"]]
    table = BenchmarkTable("GPU", 91900, [KernelBench("k", "forward", ConvProblem(4, 8, 8, 8, 8, 3, 3), rows)],
                           "strict", {"sources": ["legacy", "mec", "relayout", "fold"]})
    kept = own.restricted(table, {"legacy", "relayout", "fold"})
    assert [(m.source, m.algo) for m in kept.kernels[0].measurements] == [("legacy", 1), ("relayout", 1)]
    assert kept.extra["sources"] == ["legacy", "relayout", "fold"]
