"""Legacy configurations that run through their graph-API twins (no GPU: the graph source on the fake frontend of
test_graph_source / test_pruning_overlap, the legacy launch with fake descriptors and a recording cuDNN call).

What the twin is (``legacy_engines.TWIN_ENGINES``, ``GraphSource.twin``): cuDNN 9 runs each legacy transform-domain
algorithm as one graph-API engine; a plan built once for that engine runs the same kernels with less host work a
call.  The graph source accepts an engine as the twin only when it builds with no tensor-core / down-converting /
reduced-precision note (nor a nondeterministic one for a deterministic row) and needs exactly the legacy
algorithm's workspace.  Real execution against the legacy call: tests/test_gpu_execute.py.
"""
from __future__ import annotations

import dataclasses

import pytest

from test_graph_source import Cfg, P
from test_pruning_overlap import EngineFrontend

from ucudnn.legacy_engines import TWIN_ENGINES
from ucudnn.measure.sources import graph as G
from ucudnn.measure.sources import legacy as L
from ucudnn.measure.sources.base import Native, Operands
from ucudnn.planning.table import Measurement

ENGINES = {"A": [Cfg(4, ws=1000), Cfg(50, ws=2000), Cfg(5, ws=1000), Cfg(6, notes={"TENSOR_CORE"}, ws=1000),
                 Cfg(7, notes={"NONDETERMINISTIC"}, ws=1000)]}


def _graph(lists=ENGINES):
    fe = EngineFrontend(lists)
    return G.GraphSource(fe=fe, handle_fn=lambda: 42, timer=None, blend=None), fe


def test_the_twin_is_the_first_listed_engine_that_needs_exactly_the_legacy_workspace():
    src, fe = _graph()
    cfg = src.twin("backward_data", P, (50, 5), 1000)
    assert cfg is not None and (cfg.source, cfg.algo, cfg.workspace_bytes) == ("graph", "eng5", 1000)
    assert G.EngineIdentity.from_json(cfg.engine) == G.EngineIdentity(5)
    assert src.twin("backward_data", P, (50,), 1000) is None      # engine 50 needs 2000 bytes: not the same algorithm
    assert src.twin("backward_data", P, (9,), 1000) is None       # not an engine of this problem


def test_an_engine_with_tensor_core_or_nondeterministic_notes_is_no_twin_of_a_strict_deterministic_row():
    src, _ = _graph()
    assert src.twin("forward", P, (6,), 1000) is None
    assert src.twin("forward", P, (7,), 1000) is None
    assert src.twin("forward", P, (7,), 1000, deterministic=False).algo == "eng7"


def test_a_twin_is_found_once_and_its_prepared_plan_runs_without_a_heuristics_query():
    src, fe = _graph()
    cfg = src.twin("forward", P, (4,), 1000)
    plans = fe.engine_plans
    assert src.twin("forward", P, (4,), 1000) is cfg and fe.engine_plans == plans
    ops = Operands(0x10000, 0x20000, 0x30000)
    src.prepare("forward", P, cfg)(ops, 0x100000, 1000, 1.0, 0.0)
    op, n, ran, pack, ws = fe.executions[-1]
    assert (op, n, ran.tag, ws) == ("forward", P.n, "eng4", 0x100000) and fe.queries == 0


# --- the legacy launcher ---------------------------------------------------------------------------------------
class _Descriptors:
    conv = 14

    def operands(self, op):
        return 11, 12, 13


class _TwinLaunch:
    def __init__(self):
        self.calls = []
        self.direct = object()
        self.native = Native("graph", "forward", P, engine_id=4, engine_bytes=1000)

    def __call__(self, ops, workspace, workspace_bytes, alpha, beta):
        self.calls.append((ops, workspace, workspace_bytes, alpha, beta))


@pytest.fixture
def legacy_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(L, "descriptors", lambda problem, math: _Descriptors())
    monkeypatch.setattr(L, "handle", lambda: 42)
    monkeypatch.setattr(L.cudnn, "convolution", lambda *args: calls.append(args))
    return calls


def test_a_twinned_configuration_runs_its_twin_for_plain_calls_and_the_legacy_call_to_accumulate(
        monkeypatch, legacy_calls):
    twin = _TwinLaunch()
    monkeypatch.setattr(L, "twin_of", lambda op, problem, config: twin)
    launch = L.LegacySource().prepare("forward", P, Measurement(P.n, 5, "FMA", 1.0, 1000))
    ops = Operands(0x10000, 0x20000, 0x30000)
    launch(ops, 0x100000, 1000, 1.0, 0.0)
    assert twin.calls == [(ops, 0x100000, 1000, 1.0, 0.0)] and legacy_calls == []
    launch(ops, 0x100000, 1000, 1.0, 1.0)                       # accumulating: cuDNN's beta, no scratch needed
    launch(Operands(0x10004, 0x20000, 0x30000), 0x100000, 1000, 1.0, 0.0)   # misaligned for the graph API
    assert len(twin.calls) == 1 and [c[11] for c in legacy_calls] == [1.0, 0.0]
    assert launch.direct is twin.direct
    assert (launch.native.kind, launch.native.algo, launch.native.twin) == ("legacy", 5, twin.native)


def test_benchmark_timing_and_untwinned_configurations_keep_the_legacy_call(monkeypatch, legacy_calls):
    asked = []
    monkeypatch.setattr(L, "twin_of", lambda op, problem, config: asked.append(config.algo))
    launch = L.LegacySource().prepare("forward", P, Measurement(P.n, 0, "FMA", 1.0, 0))
    assert asked == [0] and launch.native.twin is None
    L.LegacySource().prepare("forward", P, Measurement(P.n, 5, "FMA", 1.0, 1000), twin=False)
    assert asked == [0]
    launch(Operands(0x10000, 0x20000, 0x30000), 0, 0, 1.0, 0.0)
    assert len(legacy_calls) == 1


@pytest.mark.parametrize("op, algo, dtype, env", [
    ("forward", 0, "float32", None),          # a GEMM algorithm: its engine's knobs are cuDNN's per-problem choice
    ("backward_filter", 3, "float32", None),
    ("forward", 5, "float16", None),          # only float32's transform-domain algorithms
    ("forward", 5, "float32", "0"),           # UCUDNN_LEGACY_TWINS=0
])
def test_no_twin_is_looked_for_outside_the_table_or_when_switched_off(monkeypatch, op, algo, dtype, env):
    from ucudnn.measure.sources import registry

    monkeypatch.setattr(registry, "get", lambda name: pytest.fail("the graph source was asked"))
    if env is not None:
        monkeypatch.setenv("UCUDNN_LEGACY_TWINS", env)
    p = dataclasses.replace(P, dtype=dtype)
    assert L.twin_of(op, p, Measurement(p.n, algo, "FMA", 1.0, 1000)) is None


def test_every_transform_domain_algorithm_has_engines_and_no_gemm_algorithm_does():
    # cuDNN's enums: forward FFT 4, FFT_TILING 5, WINOGRAD_NONFUSED 7; backward data FFT 2, FFT_TILING 3,
    # WINOGRAD_NONFUSED 5; backward filter FFT 2, WINOGRAD_NONFUSED 5 (FFT_TILING 6 has no entry: not seen running)
    assert set(TWIN_ENGINES) == {("forward", 4), ("forward", 5), ("forward", 7), ("backward_data", 2),
                                   ("backward_data", 3), ("backward_data", 5), ("backward_filter", 2),
                                   ("backward_filter", 5)}
    assert all(v for v in TWIN_ENGINES.values())


# --- the diagnostics that found them (benchmarks/legacy_twins.py, benchmarks/torch_fwd_host.py) ---------------
def test_the_api_log_parser_takes_the_first_engine_after_each_calls_marker():
    from bench_scripts import load

    lt = load("legacy_twins")
    cfg = '{"operationGraph": {}, "engine": {"engineId": %d, "knobChoices": {"CUDNN_KNOB_TYPE_WORKSPACE": -1}}}'
    log = ["I! CuDNN function cudnnGetConvolutionForwardWorkspaceSize() called:",
           "i!     apiLog: type=json; val=" + cfg % 28 + ";",            # before any marker: ignored
           "@@@ MARK p forward algo 7 call 0", "i!     apiLog: type=json; val=" + cfg % 6 + ";",
           "i!     apiLog: type=json; val=" + cfg % 99 + ";",            # a later finalization: not the call's
           "@@@ MARK p forward algo 7 call 1", "i!     apiLog: type=json; val=" + cfg % 6 + ";",
           "@@@ MARK p backward_data algo 3 call 0", "@@@ FAIL CUDNN_STATUS_NOT_SUPPORTED"]
    assert lt.parse_log(log) == {"p forward 7": [6, {"WORKSPACE": -1}]}


def test_the_host_comparison_groups_layers_by_plan_kind_and_refuses_records_of_different_plans():
    import pytest as _pytest
    from bench_scripts import load

    fh = load("torch_fwd_host")
    assert fh._kind("legacy:64:5") == "legacy a5" and fh._kind("graph:64:eng70_k2=2_k18=0") == "graph"
    assert fh._kind("legacy:32:5 legacy:32:5:5 graph:32:eng4") == "legacy a5+graph"

    def rec(us, plan="legacy:64:5"):
        row = {"layer": "l1", "plan": plan, "plan_dx": "legacy:64:3", "plan_dw": "graph:64:eng67", "torch_us": 30.0,
               "ucudnn_us": us, "backward_torch_us": 100.0, "backward_ucudnn_us": 2 * us}
        return {"rows": [row, {**row, "layer": "l2", "plan": "graph:64:eng70"}]}

    md = fh.compare(rec(60.0), rec(90.0), "twins", "no-twins")
    assert "| forward | legacy a5 | 1 | 60 | 90 | -30 | 30 | 30 |" in md
    assert "| backward | legacy a3 / graph | 2 | 240 | 360 | -60 | 200 | 200 |" in md
    assert md.rstrip().endswith("| all | | 2 | 360 | 540 | | 260 | 260 |")
    with _pytest.raises(ValueError, match="different plans"):
        fh.compare(rec(60.0), rec(90.0, plan="legacy:64:7"))


def test_a_bad_switch_value_is_refused_naming_the_variable(monkeypatch):
    from ucudnn import config
    from ucudnn.errors import InputError

    monkeypatch.setenv("UCUDNN_LEGACY_TWINS", "maybe")
    with pytest.raises(InputError) as e:
        config.legacy_twins()
    assert e.value.field == "UCUDNN_LEGACY_TWINS"
    monkeypatch.setenv("UCUDNN_LEGACY_TWINS", "off")
    assert config.legacy_twins() is False
    monkeypatch.delenv("UCUDNN_LEGACY_TWINS")
    assert config.legacy_twins() is True


def test_the_on_off_report_takes_medians_over_rounds_per_kernel_and_in_total():
    from bench_scripts import load

    ab = load("twins_ab")
    rounds = {"on": [{"k1": 1.0, "k2": 2.0}, {"k1": 1.2, "k2": 2.0}, {"k1": 1.1, "k2": 2.2}],
              "off": [{"k1": 2.0, "k2": 2.0}, {"k1": 2.2, "k2": 2.1}, {"k1": 1.9, "k2": 2.0}]}
    s = ab.summarize(rounds, {"k1": "16x16 a7/FMA", "k2": "256 aeng1/FMA"})
    assert s["totals_ms"] == {"on": [3.0, 3.2, 3.3], "off": [4.0, 4.3, 3.9]}
    assert (s["median_total_on_ms"], s["median_total_off_ms"]) == (3.2, 4.0)
    assert s["kernels"][0] == {"kernel": "k1", "plan": "16x16 a7/FMA", "on_ms": 1.1, "off_ms": 2.0,
                               "off_over_on": 1.818}
    doc = {"network": "alexnet", "batch": 256, "dtype": "float32", "layout": "NCHW", "limit": "64MiB",
           "unwritten": True, "table": "t.json.gz", "rounds": 3, "summary": s}
    md = ab.markdown({"device": "NVIDIA H200"}, doc)
    assert "**1.250x**" in md and "| k1 | 16x16 a7/FMA | 1.1 | 2.0 | 1.818 |" in md


def test_the_twin_table_holds_the_engines_cudnns_log_showed_and_leaves_out_the_tuned_gemms():
    """The recorded H200 log (``benchmarks/results/legacy_twins_h200.engines.json``: the engine each legacy call ran
    as, on seven public problems): every twinned algorithm ran only as engines its entry lists, and the
    IMPLICIT_PRECOMP_GEMM algorithms, left out, ran as several engines and knob choices."""
    import collections
    import json
    from pathlib import Path

    log = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" /
                      "legacy_twins_h200.engines.json").read_text())
    ran = collections.defaultdict(set)
    for key, (engine, knobs) in log.items():
        problem, op, algo = key.split()
        if "f16" not in problem:       # the table is float32's
            ran[(op, int(algo))].add((engine, json.dumps(knobs, sort_keys=True)))
    for (op, algo), engines in TWIN_ENGINES.items():
        assert ran[(op, algo)], f"{op} algo {algo} never ran in the log"
        assert {e for e, _ in ran[(op, algo)]} <= set(engines), (op, algo, ran[(op, algo)])
    for gemm in (("forward", 1), ("backward_data", 1), ("backward_filter", 1)):
        assert gemm not in TWIN_ENGINES and len(ran[gemm]) > 2


def test_logged_knob_names_become_the_numbers_engine_tags_carry():
    from bench_scripts import load

    lt = load("legacy_twins")
    assert lt.knob_numbers({"TILE_SIZE": 4, "USE_TEX": 0}) == {2: 4, 3: 0}
    assert G.EngineIdentity(28, tuple(lt.knob_numbers({"TILE_SIZE": 4, "USE_TEX": 0}).items())).tag == "eng28_k2=4_k3=0"
    with pytest.raises(ValueError):
        lt.knob_numbers({"NOT_A_KNOB": 1})
