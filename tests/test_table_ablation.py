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
