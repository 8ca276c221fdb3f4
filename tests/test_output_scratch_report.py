"""benchmarks/output_scratch.py: planned totals with and without the memory a call has not written yet, from a
recorded table alone (no GPU)."""
from __future__ import annotations

import pytest
from bench_scripts import load

from ucudnn.planning.table import BenchmarkTable, KernelBench, Measurement
from ucudnn.problem import ConvProblem

MiB = 1 << 20


def test_the_report_plans_each_kernel_with_and_without_unwritten_memory(tmp_path):
    scratch = load("output_scratch")
    first = ConvProblem(4, 3, 8, 8, 8, 3, 3, pad=1)                 # the network's first layer: no dx for it
    layer = ConvProblem(4, 8, 64, 64, 8, 3, 3, pad=1)               # dx: 4 x 8 x 64 x 64 x 4 B = 512 KiB
    fast_big = [Measurement(4, "big", "FMA", 1.0, 400 << 10), Measurement(1, "small", "FMA", 0.5, 0)]
    table = BenchmarkTable("GPU", 91900, [
        KernelBench("conv1/backward_filter", "backward_filter", first, list(fast_big)),
        KernelBench("conv2/backward_filter", "backward_filter", layer, list(fast_big))], "strict",
        extra={"batch_policy": "powerOfTwo", "network": "toy"})
    path = tmp_path / "toy.table.json.gz"
    table.save(path)
    doc = scratch.analyse(path, ["256KiB"])
    [lim] = doc["limits"]
    rows = {r["kernel"]: r for r in lim["rows"]}
    # the first layer stays at the limit (4 x 0.5 ms); the other runs its 400 KiB configuration in its dx
    assert rows["conv1/backward_filter"]["with_ms"] == rows["conv1/backward_filter"]["alone_ms"] == 2.0
    assert rows["conv2/backward_filter"]["with_ms"] == 1.0 and rows["conv2/backward_filter"]["unwritten_used_mib"]
    assert lim["fraction_with"] == pytest.approx(2.0 / 3.0) and lim["fraction_alone"] == pytest.approx(0.5)
    md = scratch.markdown([doc], {"date": "d", "command": "c"})
    assert "| toy | 256KiB | 4.00 | 3.00 | 2.00 | 0.500 -> **0.667** |" in md
