"""benchmarks/channel_wr.py's report: with ``--without``, the same limits planned without those sources appear
beside the plan with them (issue 18's "with and without the new configurations", one run); without the option the
report is as before."""
from __future__ import annotations

from bench_scripts import load

MiB = 1 << 20


def _doc(without):
    row = {"limit_bytes": 64 * MiB, "batch": {"executed_ms": 60.0, "max_workspace_mib": 63.0},
           "channels": {"executed_ms": 58.5, "max_workspace_mib": 63.5, "sliced_kernels": 0},
           "speedup_vs_batch": 1.026, "fraction_of_unbounded": 0.797, "vs_pytorch": 1.06, "short_kernels": []}
    if without:
        row.update(without={"executed_ms": 93.1, "max_workspace_mib": 60.0}, speedup_vs_without=1.591)
    return {"network": "vgg16", "batch": 64, "dtype": "float32", "layout": "NCHW", "numerics": "strict",
            "sources": "legacy,graph,winograd", "channel_policy": "none", "without": without, "benchmark_s": 1.0,
            "rows_recorded": {"whole": 1, "sliced": 0}, "unbounded_limit": 4096 * MiB,
            "unbounded": {"executed_ms": 46.6, "max_workspace_mib": 3528.6}, "pytorch_ms": 61.95, "rows": [row]}


def test_the_without_table_follows_the_main_one_when_asked():
    md = load("channel_wr").markdown({"device": "GPU"}, _doc("winograd"))
    assert "The same limits planned without winograd" in md
    assert "| 64 MiB | 93.1 (60.0) | 58.5 | 1.591 |" in md


def test_no_without_table_when_not_asked():
    md = load("channel_wr").markdown({"device": "GPU"}, _doc(None))
    assert "planned without" not in md and "| 64 MiB | 60.0 (63.0) | 58.5 (63.5) | 0 | 1.026 | 0.797 | 1.06 |" in md


def test_the_unwritten_table_reports_its_fraction_beside_the_channels_plans():
    doc = _doc(None)
    doc["unwritten"] = True
    doc["rows"][0].update(unwritten={"executed_ms": 50.0, "max_workspace_mib": 63.0, "unwritten_kernels": 9},
                          fraction_unwritten=0.932)
    md = load("channel_wr").markdown({"device": "GPU"}, doc)
    assert "memory their call has not written yet" in md
    assert "| 64 MiB | 50.0 (63.0) | 9 | 0.932 | 0.797 |" in md
    assert "not written yet" not in load("channel_wr").markdown({"device": "GPU"}, _doc(None))
