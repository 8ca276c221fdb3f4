"""benchmarks/own_kernels.py's per-kernel verdicts (issue 17) from recorded rows alone (no GPU).

"At equal workspace" means: the new sources' fastest configuration against cuDNN's fastest that needs no more
workspace than it; direct against cuDNN's fastest zero-workspace row.  The rows here are synthetic so each verdict
is known in advance; the H100 rows are in benchmarks/results/own_kernels_*.jsonl.
"""
from __future__ import annotations

import json
from argparse import Namespace

import pytest
from bench_scripts import load

from ucudnn.planning.table import KernelBench, Measurement, Skipped
from ucudnn.problem import ConvProblem

MiB = 1 << 20


@pytest.fixture(scope="module")
def ok():
    return load("own_kernels")


def bench(rows, skipped=()):
    p = ConvProblem(8, 1, 28, 28, 64, 3, 3, pad=(1, 1), layout="NHWC")
    return KernelBench("l/forward", "forward", p, list(rows), list(skipped), 1.0)


def m(source, algo, ms, ws):
    return Measurement(8, algo, "FMA", ms, ws, source)


def test_the_new_best_is_compared_with_cudnns_best_within_its_workspace(ok):
    r = ok.summarise("l", "forward", 8, bench([
        m("mec", "mec-A", 1.0, 4 * MiB), m("legacy", 1, 3.0, 0), m("legacy", 6, 2.0, 4 * MiB),
        m("graph", "eng0", 0.5, 64 * MiB)]))
    assert r["new_best"]["source"] == "mec"
    assert r["cudnn_within_new_ws"]["algo"] == "6"          # 4 MiB fits, the 64 MiB engine does not
    assert r["speedup_equal_ws"] == 2.0
    assert r["cudnn_any"]["ms"] == 0.5


def test_direct_is_compared_with_cudnns_zero_workspace_best(ok):
    r = ok.summarise("l", "forward", 8, bench([
        m("direct", "direct-single", 1.0, 0), m("legacy", 0, 1.6, 0), m("legacy", 1, 1.5, 0),
        m("legacy", 6, 0.2, MiB)]))
    assert r["direct_vs_cudnn_zero"] == 1.5
    assert r["speedup_equal_ws"] == 1.5                      # direct needs none, so cuDNN gets none either


def test_a_kernel_the_new_sources_decline_has_no_verdict_but_says_why(ok):
    r = ok.summarise("l", "backward_filter", 8, bench(
        [m("legacy", 0, 1.0, 0)], [Skipped(8, "direct", None, "direct: no backward-filter kernel")]))
    assert r["new_best"] is None and "speedup_equal_ws" not in r
    assert r["declined"] == ["direct: no backward-filter kernel"]


def test_the_report_merges_runs_and_names_what_was_not_measured(ok, tmp_path):
    rows = [{"provenance": {"date": "1"}, "layer": "cv12", "op": "forward", "n": 8, "speedup_equal_ws": 0.5},
            {"provenance": {"date": "2"}, "layer": "cv12", "op": "forward", "n": 8, "speedup_equal_ws": 2.0},
            {"provenance": {"date": "3"}, "layer": "cv11", "op": "forward", "n": 8, "speedup_equal_ws": 1.0}]
    tag = "own_kernels_seed002-float32-NHWC-strict"
    (tmp_path / f"{tag}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ok.report(tmp_path, Namespace(numerics=None, dtype="float32", layer_set="seed002", batch=256, layout="NHWC",
                                  sizes="8", ops="forward"))
    doc = json.loads((tmp_path / f"{tag}.json").read_text())
    assert [(r["layer"], r["speedup_equal_ws"]) for r in doc["rows"]] == [("cv11", 1.0), ("cv12", 2.0)]
    assert "cv1/forward@8" in doc["not_measured"] and "cv12/forward@8" not in doc["not_measured"]
    assert "faster than cuDNN at equal workspace: 1 of 2 rows" in (tmp_path / f"{tag}.md").read_text()
