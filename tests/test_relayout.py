"""The relayout source's bookkeeping without a GPU: layouts, workspace, wiring, tables and plans.

Execution against undivided cuDNN is in test_gpu_execute.py (GPU).
"""
from __future__ import annotations

import pytest

from ucudnn.errors import UcudnnError
from ucudnn.measure.sources.base import Operands
from ucudnn.measure.sources.relayout import RelayoutSource, other_layout, segments
from ucudnn.planning.planner import plan
from ucudnn.planning.table import BenchmarkTable, KernelBench, Measurement
from ucudnn.problem import ConvProblem

P = ConvProblem(64, 3, 227, 227, 96, 11, 11, stride=(4, 4), dtype="float16")  # AlexNet conv1, NCHW


def test_the_other_layout_swaps_nchw_and_nhwc_and_keeps_the_convolution():
    q = other_layout(P)
    assert q.layout == "NHWC" and other_layout(q) == P
    assert (q.n, q.c, q.h, q.w, q.k, q.r, q.s, q.stride) == (P.n, P.c, P.h, P.w, P.k, P.r, P.s, P.stride)


def test_operand_shapes_follow_cudnns_order_in_the_problems_layout():
    q = other_layout(P)
    assert P.operand_shapes("forward") == (P.x_shape(), P.w_shape(), P.y_shape())
    assert q.operand_shapes("backward_data") == ((96, 11, 11, 3), q.y_shape(), q.x_shape())
    assert q.operand_shapes("backward_filter") == (q.x_shape(), q.y_shape(), (96, 11, 11, 3))


def test_the_workspace_added_is_the_three_transformed_operands_each_aligned():
    x, w, y = 64 * 3 * 227 * 227 * 2, 96 * 3 * 11 * 11 * 2, 64 * 96 * 55 * 55 * 2
    up = lambda n: -(-n // 256) * 256  # noqa: E731
    assert segments("forward", P, 2) == [up(x), up(w), up(y)]
    assert segments("backward_filter", P, 2) == [up(x), up(y), up(w)]
    assert all(s % 256 == 0 for s in segments("backward_data", other_layout(P), 4))


def test_preparing_prepares_the_inner_configuration_in_the_other_layout_without_the_moved_bytes(inner):
    moved = sum(segments("forward", other_layout(P), 2))
    cfg = Measurement(64, 1, "DEFAULT", 1.0, moved + 4096, "relayout", None,
                      {"via": {"layout": "NHWC", "source": inner.name}, "deterministic": True})
    RelayoutSource().prepare("forward", P, cfg)
    [(op, problem, inner_cfg)] = inner.prepared
    assert (op, problem) == ("forward", other_layout(P))
    assert (inner_cfg.source, inner_cfg.algo, inner_cfg.workspace_bytes) == (inner.name, 1, 4096)
    assert "via" not in inner_cfg.extra and inner_cfg.extra["deterministic"] is True


def test_run_refuses_a_workspace_too_small_for_the_transformed_operands(inner):
    cfg = Measurement(64, 1, "DEFAULT", 1.0, 0, "relayout", None, {"via": {"layout": "NHWC", "source": inner.name}})
    with pytest.raises(UcudnnError, match="workspace for the transformed operands"):
        RelayoutSource().run("forward", P, cfg, Operands(0, 0, 0), 0, 1 << 20, 1.0, 0.0)


def test_run_refuses_a_configuration_measured_via_another_layout(inner):
    cfg = Measurement(64, 1, "DEFAULT", 1.0, 0, "relayout", None, {"via": {"layout": "NCHW", "source": inner.name}})
    with pytest.raises(UcudnnError, match="via NCHW"):
        RelayoutSource().run("forward", P, cfg, Operands(0, 0, 0), 0, 1 << 30, 1.0, 0.0)


def test_relayout_by_name_wraps_the_other_sources_named():
    from ucudnn.measure.benchmarking import resolve_sources
    from ucudnn.measure.sources import registry

    legacy, relayout = resolve_sources("legacy,relayout")
    assert relayout.name == "relayout" and [s.name for s in relayout.inner] == ["legacy"]
    assert registry.get("relayout") is relayout
    (alone,) = resolve_sources("relayout")
    assert [s.name for s in alone.inner] == ["legacy"]


def test_a_relayout_source_cannot_wrap_itself():
    with pytest.raises(ValueError):
        RelayoutSource([RelayoutSource()])


def _table(measurements):
    return BenchmarkTable("NVIDIA H100 80GB HBM3", 91900,
                          [KernelBench("conv1/forward", "forward", P, measurements, [], 1.0)], "default")


def test_a_table_with_relayout_measurements_is_valid_and_round_trips():
    via = {"layout": "NHWC", "source": "legacy", "inner_time_ms": 0.9, "transform_ms": 0.1}
    t = _table([Measurement(64, 1, "DEFAULT", 3.0, 0),
                Measurement(64, 1, "TENSOR_OP", 1.0, 40 << 20, "relayout", None, {"via": via})])
    back = BenchmarkTable.loads(t.to_json())  # validated against the schema
    m = back.kernels[0].measurements[1]
    assert (m.source, m.extra["via"]) == ("relayout", via)


def test_the_planner_takes_a_relayout_configuration_only_where_it_wins_within_the_limit():
    via = {"layout": "NHWC", "source": "legacy", "inner_time_ms": 0.9, "transform_ms": 0.1}
    t = _table([Measurement(64, 1, "DEFAULT", 3.0, 0), Measurement(32, 1, "DEFAULT", 1.6, 0),
                Measurement(64, 1, "TENSOR_OP", 1.0, 40 << 20, "relayout", None, {"via": via}),
                Measurement(32, 1, "TENSOR_OP", 0.5, 20 << 20, "relayout", None, {"via": via})])
    wide = plan(t, "wr", workspace_limit=64 << 20, batch_policy="powerOfTwo")
    assert [c.source for c in wide.kernels[0].configs] == ["relayout"]
    assert wide.kernels[0].configs[0].micro_batch == 64
    narrow = plan(t, "wr", workspace_limit=24 << 20, batch_policy="powerOfTwo")
    assert [(c.micro_batch, c.source) for c in narrow.kernels[0].configs] == [(32, "relayout")] * 2
    tiny = plan(t, "wr", workspace_limit=1 << 20, batch_policy="powerOfTwo")
    assert {c.source for c in tiny.kernels[0].configs} == {"legacy"}


def test_a_relayout_measurement_naming_an_unknown_layout_is_refused_naming_the_field():
    from ucudnn.errors import TableError

    t = _table([Measurement(64, 1, "DEFAULT", 1.0, 0, "relayout", None, {"via": {"layout": "CHWN", "source": "legacy"}})])
    with pytest.raises(TableError) as e:
        BenchmarkTable.loads(t.to_json())
    assert "measurements[0].via.layout" in str(e.value)


# --- a table recorded on an H100 (benchmarks/graph_wr.py --relayout legacy,graph --tables-out) --------------
RECORDED = (__import__("pathlib").Path(__file__).parent / "fixtures"
            / "alexnet-b256-float32-NHWC-strict-legacy-graph-relayout-h100.json.gz")


def test_recorded_relayout_measurements_say_what_they_wrap_and_count_the_moved_operands():
    t = BenchmarkTable.load(RECORDED)
    relayed = [(k, m) for k in t.kernels for m in k.measurements if m.source == "relayout"]
    assert relayed and {m.extra["via"]["source"] for _, m in relayed} == {"legacy", "graph"}
    for k, m in relayed:
        assert m.extra["via"]["layout"] == "NCHW"
        moved = sum(segments(k.op, other_layout(k.problem.with_batch(m.micro_batch)), 4))
        assert m.workspace_bytes >= moved


def test_wr_on_the_recorded_table_runs_some_micro_batches_in_the_other_layout_within_the_limit():
    t = BenchmarkTable.load(RECORDED)
    wr = plan(t, "wr", workspace_limit=64 << 20, batch_policy="powerOfTwo")
    assert all(k.workspace_bytes <= 64 << 20 and k.batch == 256 for k in wr.kernels)
    assert any(c.source == "relayout" for k in wr.kernels for c in k.configs)
    native = BenchmarkTable(t.device, t.cudnn_version, [
        KernelBench(k.name, k.op, k.problem, [m for m in k.measurements if m.source != "relayout"], k.skipped,
                    k.benchmark_seconds) for k in t.kernels], t.numerics, dict(t.extra))
    without = plan(native, "wr", workspace_limit=64 << 20, batch_policy="powerOfTwo")
    assert wr.total_time_ms < without.total_time_ms   # more configurations never plan slower; here they win
