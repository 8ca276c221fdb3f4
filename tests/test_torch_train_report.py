"""benchmarks/torch_train.py's report: issue 15's bars computed from recorded runs alone (no GPU, no torch).

The records are synthetic so every verdict is known in advance; the real H100 records are in
benchmarks/results/torch_train_h100.jsonl.
"""
from __future__ import annotations

import json

import pytest
from bench_scripts import load


@pytest.fixture(scope="module")
def tt():
    return load("torch_train")


def run(model, mode, impl, images, cap=None, status="ok", sources_used=None, batch=128):
    return {"model": model, "batch": batch, "mode": mode, "impl": impl, "cap_pct": cap,
            "cap_base": "peak_reserved" if cap is not None else None, "status": status,
            "images_per_s": images if status == "ok" else None, "peak_allocated": 1 << 30, "peak_reserved": 2 << 30,
            "first_step_s": 1.0, "sources_used": sources_used, "device": "NVIDIA H100 80GB HBM3"}


def records(tmp_path, rows):
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_bars_follow_the_recorded_runs(tt, tmp_path):
    rows = [run("resnet50", "fp32", "torch", 100.0), run("resnet50", "fp32", "ucudnn-256", 96.0),
            run("resnet50", "fp32", "ucudnn-64", 90.0),
            # PyTorch survives 85% but not 80%; ucudnn-64 survives 75% (<= 0.9 x 85) but not 70%
            run("resnet50", "fp32", "torch", 50.0, cap=85), run("resnet50", "fp32", "torch", 0, cap=80, status="oom"),
            run("resnet50", "fp32", "ucudnn-64", 70.0, cap=85), run("resnet50", "fp32", "ucudnn-64", 65.0, cap=75),
            run("resnet50", "fp32", "ucudnn-64", 0, cap=70, status="oom"),
            run("resnet50", "amp", "torch", 400.0), run("resnet50", "amp", "ucudnn-256", 200.0,
                                                        sources_used="legacy,graph,fold")]
    s = tt.summarize(tt.load(records(tmp_path, rows))[0])
    [b1] = s["bar1"]
    assert (b1["torch_cap"], b1["ucudnn_cap"], b1["met"], b1["decided"]) == (85, 75, True, True)
    [b2] = s["bar2"]
    assert b2["speedup"] == pytest.approx(70 / 50) and b2["met"]            # 1.4x >= 1.3x
    b3 = {(b["mode"], b["sources"]): b for b in s["bar3"]}
    assert b3[("fp32", "legacy")]["met"] and b3[("fp32", "legacy")]["ratio"] == pytest.approx(0.96)
    assert not b3[("amp", "legacy,graph,fold")]["met"]                      # 0.5x < 0.95x
    assert s["modes_not_measured"] == ["default"]


def test_the_report_says_where_runs_were_measured_and_never_reads_this_machine(tt, tmp_path):
    rows = [run("vgg16", "fp32", "torch", 100.0, batch=64), run("vgg16", "fp32", "ucudnn-256", 120.0, batch=64)]
    rows[1].pop("device")
    md = tmp_path / "report.md"
    assert tt.report(records(tmp_path, rows), md) == 0
    text = md.read_text()
    assert "NVIDIA H100 80GB HBM3 (not recorded for 1 of 2 runs)" in text
    assert "| VGG-16 b64 | fp32 | ucudnn-256 | legacy | 120 | 1.20x |" in text


def test_host_ab_pairs_each_after_run_with_the_before_run_just_before_it_per_machine():
    """benchmarks/torch_host_ab.py's report: interleaved runs of two code trees on one machine are compared in
    pairs (an after-run against the before-run just preceding it), never across machines."""
    ab = load("torch_host_ab")

    def rec(machine, t, label, ms):
        return {"machine": machine, "recorded_at": f"2026-01-01T00:00:{t:02d}", "mode": "amp", "label": label,
                "step_ms": ms, "device": "GPU", "torch": "2", "cudnn": 9}

    records = [rec("a", 1, "torch", 20.0), rec("a", 2, "before", 40.0), rec("a", 3, "after", 30.0),
               rec("a", 4, "before", 50.0), rec("a", 5, "after", 25.0), rec("a", 6, "after", 35.0),
               rec("b", 1, "after", 10.0), rec("b", 2, "before", 20.0)]
    doc, md = ab.report(records)
    a, b = doc["machines"]["a"], doc["machines"]["b"]
    assert a["pair_ratios"] == [0.75, 0.5]           # the third after-run has no before-run of its own
    assert a["median_before_ms"] == 45.0 and a["median_after_ms"] == 30.0 and a["after_vs_torch"] == round(20 / 30, 3)
    assert b["pair_ratios"] == [] and b["after_vs_torch"] is None
    assert "| a | 40.00, 50.00 | 30.00, 25.00, 35.00 | 0.75, 0.5 |" in md


def test_a_row_measured_several_times_in_one_series_reports_their_median(tt, tmp_path):
    """--repeat: the report takes the median images/s of the latest series (one invocation's interleaved
    repeats), not whichever run came last; runs of an older series or without one do not join it."""
    def in_series(r, series, rep):
        return {**r, "series": series, "repeat": rep}

    rows = [run("resnet50", "amp", "torch", 4000.0), run("resnet50", "amp", "ucudnn-256", 5000.0),   # no series
            in_series(run("resnet50", "amp", "torch", 4600.0), "s1", 0),
            in_series(run("resnet50", "amp", "ucudnn-256", 3600.0), "s1", 0),
            in_series(run("resnet50", "amp", "torch", 4500.0), "s1", 1),
            in_series(run("resnet50", "amp", "ucudnn-256", 4400.0), "s1", 1),
            in_series(run("resnet50", "amp", "torch", 4700.0), "s1", 2),
            in_series(run("resnet50", "amp", "ucudnn-256", 3900.0), "s1", 2),
            in_series(run("resnet50", "amp", "ucudnn-256", 0, status="oom"), "s1", 3)]   # failed: not a sample
    recs, _ = tt.load(records(tmp_path, rows))
    s = tt.summarize(recs)
    [b3] = s["bar3"]
    assert b3["ratio"] == pytest.approx(3900 / 4600)
    row = next(r for r in s["rows"] if r["impl"] == "ucudnn-256")
    assert row["repeats"] == {"n": 3, "images_per_s": [3600.0, 3900.0, 4400.0]}
    md = tmp_path / "report.md"
    tt.report(records(tmp_path, rows), md)
    assert "| 3900 (median of 3: 3600-4400) | 0.85x |" in md.read_text()


def test_another_workload_gets_its_rows_and_no_verdict_on_issue_15s_bars(tt, tmp_path):
    """MobileNet V2 (a public workload the issue does not name): its rows, and no 'missed' bars it was never
    measured for."""
    rows = [run("mobilenet_v2", "fp32", "torch", 100.0), run("mobilenet_v2", "fp32", "ucudnn-64", 113.0,
                                                            sources_used="legacy,graph,direct,fold")]
    md = tmp_path / "report.md"
    assert tt.report(records(tmp_path, rows), md) == 0
    text = md.read_text()
    assert "| mobilenet_v2 b128 | fp32 | ucudnn-64 | legacy,graph,direct,fold | 113 | 1.13x |" in text
    assert "## Issue 15's bars" not in text and "missed" not in text
    assert "none of them is in these records" in text


def test_records_of_another_mode_leave_the_fp32_cap_bars_unmeasured_and_bar_3_open(tt, tmp_path):
    """Default-mode records with a cap search: bars 1 and 2 (FP32 caps) are not measured there, not missed; bar 3
    met on every measured row with fp32 and amp unmeasured is not decided.  One row under 0.95x makes it missed."""
    rows = [run("alexnet", "default", "torch", 100.0, batch=256),
            run("alexnet", "default", "ucudnn-64", 105.0, batch=256),
            run("alexnet", "default", "ucudnn-256", 110.0, batch=256),
            run("alexnet", "default", "torch", 10.0, cap=70, batch=256),
            run("alexnet", "default", "ucudnn-64", 100.0, cap=65, batch=256)]
    md = tmp_path / "report.md"
    tt.report(records(tmp_path, rows), md)
    text = md.read_text()
    assert text.count("**not measured here** (no FP32 cap search in these records)") == 2
    assert "every model and mode: **not decided** (1 of 1 measured model x mode; not measured here: fp32 (ResNet-50, " \
        "VGG-16, AlexNet); default (ResNet-50, VGG-16); amp (ResNet-50, VGG-16, AlexNet))" in text
    rows[2] = run("alexnet", "default", "ucudnn-256", 90.0, batch=256)
    tt.report(records(tmp_path, rows), md)
    assert "every model and mode: **missed** (0 of 1 measured" in md.read_text()


def test_memory_summary_keeps_the_allocators_state_and_leaves_out_what_it_lacks(tt):
    stats = {"allocated_bytes.all.current": 5, "allocated_bytes.all.peak": 9, "reserved_bytes.all.peak": 12,
             "inactive_split_bytes.all.peak": 3, "num_alloc_retries": 2, "num_ooms": 1,
             "active_bytes.all.peak": 99, "requested_bytes.all.peak": 98}
    assert tt.memory_summary(stats) == {"allocated_bytes.all.current": 5, "allocated_bytes.all.peak": 9,
                                        "reserved_bytes.all.peak": 12, "inactive_split_bytes.all.peak": 3,
                                        "num_alloc_retries": 2, "num_ooms": 1}
    assert tt.memory_summary({}) == {}


def test_records_of_one_model_decide_the_per_model_bars_only_where_that_model_misses_them(tt, tmp_path):
    """Bar 1 asks every model: one model meeting it leaves it open (not met); one missing it is missed.  Bar 2
    asks two of three: one model's miss leaves it open, two models' misses decide it."""
    def fp32_caps(model, torch_cap, ucudnn_cap, ucudnn_speed):
        return [run(model, "fp32", "torch", 100.0), run(model, "fp32", "ucudnn-64", 100.0),
                run(model, "fp32", "torch", 20.0, cap=torch_cap), run(model, "fp32", "torch", 0, cap=torch_cap - 5,
                                                                     status="oom"),
                run(model, "fp32", "ucudnn-64", ucudnn_speed, cap=torch_cap),
                run(model, "fp32", "ucudnn-64", ucudnn_speed, cap=ucudnn_cap),
                run(model, "fp32", "ucudnn-64", 0, cap=ucudnn_cap - 5, status="oom")]

    md = tmp_path / "report.md"
    tt.report(records(tmp_path, fp32_caps("resnet50", 85, 75, 25.0)), md)      # bar 1 met, bar 2 missed (1.25x) here
    text = md.read_text()
    assert "on every model in FP32: **not decided** (1 of 1 models measured here; no FP32 cap search here for " \
        "VGG-16, AlexNet)" in text
    assert "(FP32, where the caps were searched): **not decided** (0 of 1 models measured here;" in text
    tt.report(records(tmp_path, fp32_caps("resnet50", 85, 85, 25.0) + fp32_caps("vgg16", 45, 45, 22.0)), md)
    text = md.read_text()
    assert "on every model in FP32: **missed** (0 of 2 models measured here; no FP32 cap search here for AlexNet)" \
        in text
    assert "(FP32, where the caps were searched): **missed** (0 of 2 models measured here;" in text
