"""benchmarks/wino_profile.py's pure parts: the algorithm-name parser reads every configuration the winograd source
names, the kernel kinds and the busy-time union are what its report claims, and its fixed configurations are what
their plans' limits allow."""
from __future__ import annotations

import pytest

from bench_scripts import load
from ucudnn.kernels.winograd import Geometry

MiB = 1 << 20
prof = load("wino_profile")


@pytest.mark.parametrize("algo, info", [
    ("wino-f4", {}),
    ("wino-f4-c8", {"chunk": 8}),
    ("wino-f4-t1536-k8-p2", {"tiles": 1536, "ksplit": 8, "streams": 2}),
    ("wino-f4-c8-g3-p2", {"chunk": 8, "groups": 3, "streams": 2}),
    ("wino-f4-t192-s2", {"tiles": 192, "csplit": 2}),
])
def test_config_of_reads_the_source_names(algo, info):
    assert prof.config_of(algo) == info


@pytest.mark.parametrize("algo", ["wino-f4-fused", "wino-f4-t12x", "aeng3", "wino-f4-q2"])
def test_config_of_refuses_other_names(algo):
    from ucudnn.errors import InputError

    with pytest.raises(InputError):
        prof.config_of(algo)


def test_kind_of_names_transforms_before_gemms():
    assert prof.kind_of("void wino_filter_grad<float>(...)") == "wino_filter_grad"
    assert prof.kind_of("void wino_filter<float, false>(...)") == "wino_filter"
    assert prof.kind_of("wino_dy<float,false>") == "wino_dy"
    assert prof.kind_of("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3") == "gemm"


def test_busy_is_the_union_of_intervals():
    assert prof.busy([]) == 0.0
    assert prof.busy([(0, 10), (5, 12), (20, 25)]) == 17.0
    assert prof.busy([(20, 25), (0, 30)]) == 30.0


@pytest.mark.parametrize("row", prof.CONFIGS, ids=lambda r: f"{r[0]}-{r[1]}-{r[5]}")
def test_configurations_fit_their_plans_limits(row):
    layer, op, mb, calls, algo, plan = row
    base = prof.problem(layer)
    assert mb * calls == base.n
    info = prof.config_of(algo)
    geo = Geometry.of(prof.problem(layer, mb), op)
    assert (prof.workspace_of(geo, info, mb) <= 64 * MiB) == (plan == "64 MiB")


def test_markdown_has_a_row_per_configuration_with_its_kernel_kinds():
    row = {"plan": "64 MiB", "layer": "vgg16-conv4_2", "op": "forward", "micro_batch": 64, "calls": 1,
           "algo": "wino-f4-t64-p3", "workspace_mib": 63.0, "ms_call": 2.0, "ms_call_eager": 2.1, "ms_layer": 2.0,
           "kinds": {"wino_input": {"count": 49.0, "us": 954.0}, "gemm": {"count": 49.0, "us": 2507.0}},
           "busy_us": 2240.0, "span_us": 3236.0, "gemm_tflops_in_call": 23.6, "gemm_tflops_alone": 26.3}
    md = prof.markdown({"provenance": {"device": "X"}, "rows": [row, {**row, "plan": "unbounded"}]})
    lines = [ln for ln in md.splitlines() if ln.startswith("| vgg16-conv4_2")]
    assert len(lines) == 2
    assert "| 954 (49) |" in lines[0] and "| 2507 (49) |" in lines[0] and "| 2240 / 3236 | 23.6 / 26.3 |" in lines[0]
    assert "| 2.0 (2.1) |" in lines[0]


@pytest.mark.parametrize("summary, step", [
    ("16x4 awino-f4-t1536-k8-p2/FMA", (16, 4, "wino-f4-t1536-k8-p2")),
    ("64 awino-f4-c8-g3-p2/FMA", (64, 1, "wino-f4-c8-g3-p2")),
    ("256 awino-f4/TENSOR_OP", (256, 1, "wino-f4")),
    ("64 a5/FMA", None),                                   # cuDNN's
    ("64 awino-f4-fused/FMA", None),                       # no chunks to profile
    ("32x2 awino-f4-t768-p2/FMA + 16 a1/FMA", None),       # several steps
    ("64x16 k64 a7/FMA", None),                            # a channel slice
])
def test_plan_step_reads_one_winograd_configuration(summary, step):
    assert prof.plan_step(summary) == step


def test_configs_from_results_take_each_short_kernels_winograd_plans():
    doc = {"network": "vgg16", "batch": 64, "dtype": "float32", "layout": "NCHW", "rows": [
        {"limit_bytes": 64 * MiB, "short_kernels": [
            {"kernel": "conv1_2/backward_filter", "plan": "16x4 awino-f4-t1536-k8-p2/FMA",
             "unbounded_plan": "64 awino-f4-t8192-k8-p3/FMA"},
            {"kernel": "conv4_2/backward_data", "plan": "64 awino-f4-t64-p3/FMA", "unbounded_plan": "64 a5/FMA"}]},
        {"limit_bytes": 128 * MiB, "short_kernels": []}]}
    got = prof.configs_from_results(doc, 64 * MiB)
    assert [(k, op, mb, calls, algo, plan) for k, op, _, mb, calls, algo, plan in got] == [
        ("conv1_2", "backward_filter", 16, 4, "wino-f4-t1536-k8-p2", "64 MiB"),
        ("conv1_2", "backward_filter", 64, 1, "wino-f4-t8192-k8-p3", "unbounded"),
        ("conv4_2", "backward_data", 64, 1, "wino-f4-t64-p3", "64 MiB")]
    p = got[0][2]
    assert (p.n, p.c, p.k, p.h, p.r) == (16, 64, 64, 224, 3)
    with pytest.raises(ValueError, match="no row"):
        prof.configs_from_results(doc, 32 * MiB)


@pytest.mark.parametrize("report", [
    "channel_wr_vgg16-b64-float32-NCHW-strict-winograd-ksplit-replay.json",
    "channel_wr_resnet50-b128-float32-NCHW-strict-winograd-ksplit-replay.json",
    "channel_wr_alexnet-b256-float32-NCHW-strict-fft-small-u-replay.json"])
def test_configs_from_recorded_reports_fit_the_limit_their_plan_ran_under(report):
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" / report).read_text())
    got = prof.configs_from_results(doc, 64 * MiB)
    assert got   # every recorded report has short kernels planned with winograd rows
    for _, op, p, mb, calls, algo, plan in got:
        assert p.n == mb and mb * calls == doc["batch"]
        if plan == "64 MiB":
            assert prof.workspace_of(Geometry.of(p, op), prof.config_of(algo), mb) <= 64 * MiB
