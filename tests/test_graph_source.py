"""The graph-API source's bookkeeping, on a fake frontend (no GPU).

The fake mimics nvidia-cudnn-frontend 1.22's pygraph where the source relies
on it: heuristic lists concatenated over modes, note filters that bar
configurations at once, and the error texts of a refused build ("Deselecting
execution plan" / "workspace violation").  Real execution is checked against
cuDNN in tests/test_gpu_graph.py.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math

import pytest

from ucudnn.errors import CaptureError, CudnnError, InputError, TableError
from ucudnn.measure.sources import graph as G
from ucudnn.measure.sources.base import BenchSettings, Operands
from ucudnn.planning.table import BenchmarkTable, KernelBench, Measurement
from ucudnn.problem import ConvProblem

P = ConvProblem(8, 16, 12, 12, 32, 3, 3, pad=(1, 1))
OPS = Operands(a=0x10000, b=0x20000, out=0x30000)
WS = 0x100000

# --- a fake frontend ------------------------------------------------------------------------------
HeurMode = enum.Enum("heur_mode", "A B FALLBACK")
Note = enum.Enum("numerical_note", " ".join(G.NOTES))
Behavior = enum.Enum("behavior_note", "RUNTIME_COMPILATION SUPPORTS_CUDA_GRAPH_NATIVE_API")
DataType = enum.Enum("data_type", "FLOAT HALF BFLOAT16")


class Cfg:
    """One engine configuration the fake heuristics return."""

    def __init__(self, eid, knobs=(), notes=(), ws=0, ms=1.0, supported=True, behavior=()):
        self.eid, self.knobs, self.notes, self.ws, self.ms = eid, list(knobs), set(notes), ws, ms
        self.supported, self.behavior = supported, list(behavior)

    @property
    def tag(self):  # knobs in the order the "backend" lists them (not sorted)
        return f"eng{self.eid}" + "".join(f"_k{k}={v}" for k, v in self.knobs)


class FakeTensor:
    def __init__(self, dim=None, name=""):
        self.dim, self.name = dim, name

    def set_output(self, v):
        return self

    def set_dim(self, d):
        self.dim = d
        return self

    def set_stride(self, s):
        return self

    def set_data_type(self, t):
        return self

    def set_uid(self, u):
        return self


class FakeGraph:
    def __init__(self, fe, **kw):
        self.fe, self.kw, self.op, self.n = fe, kw, None, None
        fe.graphs += 1

    def tensor(self, dim, stride, data_type, name, uid):
        if name in ("x", "y"):
            self.n = dim[0]
        return FakeTensor(dim, name)

    def conv_fprop(self, a, b, **kw):
        self.op = "forward"
        return FakeTensor()

    def conv_dgrad(self, loss, filt, **kw):
        self.op = "backward_data"
        return FakeTensor()

    def conv_wgrad(self, image, loss, **kw):
        self.op = "backward_filter"
        return FakeTensor()

    def validate(self):
        pass

    def build_operation_graph(self):
        pass

    def create_execution_plans(self, modes):
        lists = self.fe.heuristics(self.op, self.n)
        self.configs = [c for m in modes for c in lists.get(m.name, [])]
        self.barred = [False] * len(self.configs)
        self.max_ws = math.inf
        self.built = set()

    def deselect_numeric_notes(self, notes):
        names = {n.name for n in notes}
        self.barred = [b or bool(c.notes & names) for b, c in zip(self.barred, self.configs)]

    def select_numeric_notes(self, notes):
        names = {n.name for n in notes}
        self.barred = [b or not (c.notes & names) for b, c in zip(self.barred, self.configs)]

    def deselect_workspace_greater_than(self, ws):
        self.max_ws = ws

    def get_execution_plan_count(self):
        return len(self.configs)

    def get_plan_name_at_index(self, i):
        return self.configs[i].tag

    def get_behavior_notes_for_plan_at_index(self, i):
        return [getattr(Behavior, b) for b in self.configs[i].behavior]

    def build_plan_at_index(self, i):
        c = self.configs[i]
        if self.barred[i]:
            raise RuntimeError(f"[cudnn_frontend] Error: Deselecting execution plan at position {i}")
        if c.ws > self.max_ws:
            self.barred[i] = True
            raise RuntimeError(f"[cudnn_frontend] Error: Skipping plan since workspace violation. Requires {c.ws}")
        if not c.supported:
            raise RuntimeError("CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: cudnnFinalize Failed CUDNN_STATUS_NOT_SUPPORTED")
        self.built.add(i)
        self.fe.builds += 1

    def get_workspace_size_plan_at_index(self, i):
        return self.configs[i].ws if i in self.built else 0

    def execute_plan_at_index(self, pack, workspace, index, handle=None):
        assert index in self.built, "executing a plan that was not built"
        self.fe.executions.append((self.op, self.n, self.configs[index], dict(pack), workspace))


class FakeFrontend:
    heur_mode, numerical_note, behavior_note, data_type = HeurMode, Note, Behavior, DataType

    def __init__(self, lists):
        self.lists = lists   # {"A": [Cfg], ...} or a function (op, n) -> that
        self.graphs = self.builds = 0
        self.executions = []

    def heuristics(self, op, n):
        return self.lists(op, n) if callable(self.lists) else self.lists

    def pygraph(self, **kw):
        return FakeGraph(self, **kw)


class Timer:
    """Runs the function once (so the run path is exercised) and reports the engine's fake time."""

    def __init__(self, fe):
        self.fe, self.calls = fe, []

    def __call__(self, fn, repeat=5, warmup=1, min_sample_ms=0.0):
        before = len(self.fe.executions)
        fn()
        ran = self.fe.executions[before:]
        self.calls.append((ran[-1][2].tag if ran else "blend", repeat))
        return ran[-1][2].ms if ran else 0.01


def source(lists, **kw):
    fe = FakeFrontend(lists)
    blends = []
    timer = Timer(fe)
    src = G.GraphSource(fe=fe, handle_fn=lambda: 42, timer=timer,
                        blend=lambda op, p, s, d, a, b: blends.append((op, s, d, a, b)), **kw)
    return src, fe, timer, blends


def settings(numerics="strict", **kw):
    return BenchSettings(numerics, repeat=kw.pop("repeat", 3), warmup=1, max_workspace=kw.pop("max_workspace", 1 << 30),
                         min_sample_ms=0.0, trust_estimate_ms=kw.pop("trust_estimate_ms", None),
                         prune_margin=kw.pop("prune_margin", 2.0), hopeless_factor=kw.pop("hopeless_factor", 4.0))


MIXED = {"A": [Cfg(1, [(13, 1), (2, 3)], ms=2.0, ws=1 << 20),
               Cfg(7, notes={"TENSOR_CORE"}, ms=0.5, ws=4 << 20),
               Cfg(9, notes={"NONDETERMINISTIC"}, ms=1.5),
               Cfg(11, notes={"TENSOR_CORE", "DOWN_CONVERT_INPUTS"}, ms=0.3)],
         "B": [Cfg(7, notes={"TENSOR_CORE"}, ms=0.5, ws=4 << 20), Cfg(3, ms=3.0)],
         "FALLBACK": [Cfg(0, ms=9.0)]}


# --- engine identity ------------------------------------------------------------------------------
def test_engine_identity_round_trips_through_tag_and_json():
    ident = G.EngineIdentity.parse_tag("eng28_k13=1_k2=3_k29=-1")
    assert ident.engine_id == 28 and ident.knobs == ((2, 3), (13, 1), (29, -1))
    assert ident.tag == "eng28_k2=3_k13=1_k29=-1"
    doc = json.loads(json.dumps(ident.to_json()))
    assert doc == {"id": 28, "knobs": {"2": 3, "13": 1, "29": -1}}
    assert G.EngineIdentity.from_json(doc) == ident
    assert G.EngineIdentity.from_json(ident.tag) == ident
    assert G.EngineIdentity.parse_tag("eng0") == G.EngineIdentity(0)


@pytest.mark.parametrize("bad, field", [
    ({"knobs": {}}, "engine.id"), ({"id": -1, "knobs": {}}, "engine.id"), ({"id": True, "knobs": {}}, "engine.id"),
    ({"id": 3, "knobs": {"TILE": 1}}, "engine.knobs"), ({"id": 3, "knobs": {"2": "x"}}, "engine.knobs.2"),
    ({"id": 3, "knobs": [1]}, "engine.knobs"), ([3], "engine"), ("algo7", "engine"), ("eng1_k2=1_k2=3", "engine"),
])
def test_a_malformed_engine_identity_is_refused_naming_the_field(bad, field):
    with pytest.raises(InputError) as e:
        G.EngineIdentity.from_json(bad)
    assert e.value.field == field


# --- the table format -----------------------------------------------------------------------------
def _table_doc(measurement: dict) -> dict:
    kb = KernelBench("conv/forward", "forward", P, [Measurement(1, 0, "FMA", 1.0, 0)])
    doc = BenchmarkTable("H100", 91900, [kb], "strict").to_dict()
    doc["kernels"][0]["measurements"].append(measurement)
    return doc


def test_a_table_with_graph_measurements_is_valid_and_keeps_the_engine():
    m = Measurement(4, "eng7_k2=1", "TENSOR_OP", 0.5, 1 << 20, "graph", {"id": 7, "knobs": {"2": 1}},
                    {"notes": ["TENSOR_CORE"], "deterministic": True, "heuristic_rank": 1})
    t = BenchmarkTable.from_dict(json.loads(json.dumps(_table_doc(m.to_dict()))))
    got = t.kernels[0].measurements[-1]
    assert (got.source, got.engine, got.extra["notes"]) == ("graph", {"id": 7, "knobs": {"2": 1}}, ["TENSOR_CORE"])
    assert G.EngineIdentity.from_json(got.engine).tag == got.algo


def test_tables_without_sources_or_engines_stay_valid():
    from ucudnn.planning.table import builtin_tables

    for name in builtin_tables():
        t = BenchmarkTable.load(f"builtin:{name}")
        assert all(m.source == "legacy" and m.engine is None for k in t.kernels for m in k.measurements)


@pytest.mark.parametrize("change, field", [
    ({"engine": None}, "kernels[0].measurements[1]"),
    ({"engine": {"id": 7, "knobs": {"TILE": 1}}}, "kernels[0].measurements[1].engine.knobs"),
    ({"engine": {"knobs": {}}}, "kernels[0].measurements[1].engine"),
    ({"notes": ["FAST"]}, "kernels[0].measurements[1].notes[0]"),
])
def test_a_graph_measurement_without_a_usable_engine_is_refused(change, field):
    d = Measurement(4, "eng7", "FMA", 0.5, 0, "graph", {"id": 7, "knobs": {}}).to_dict()
    d.update(change)
    d = {k: v for k, v in d.items() if v is not None}
    with pytest.raises(TableError) as e:
        BenchmarkTable.from_dict(_table_doc(d))
    assert e.value.field == field


# --- numerics ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("numerics, dtype, excluded", [
    ("strict", "float32", {"TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION"}),
    ("tf32", "float32", {"DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION"}),
    ("default", "float32", set()),
    ("strict", "float16", {"DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION"}),
    ("default", "float16", set()),
    ("tf32-deterministic", "float32", {"DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "NONDETERMINISTIC"}),
])
def test_each_numerics_mode_excludes_exactly_its_notes(numerics, dtype, excluded):
    assert set(G.excluded_notes(numerics, dtype)) == excluded
    assert set(G.probed_notes(numerics, dtype)) == set(G.NUMERIC_NOTES) - excluded
    for note in G.NUMERIC_NOTES:
        assert G.admissible({note}, numerics, dtype) == (note not in excluded)


def test_math_type_labels_never_claim_stricter_math_than_guaranteed():
    assert G.math_type_label(set(), "tf32", "float32") == "FMA"
    assert G.math_type_label({"TENSOR_CORE"}, "tf32", "float32") == "TENSOR_OP"
    assert G.math_type_label({"TENSOR_CORE", "DOWN_CONVERT_INPUTS"}, "default", "float32") == "TENSOR_OP_ALLOW_CONVERSION"
    assert G.math_type_label({"REDUCED_PRECISION_REDUCTION"}, "default", "float16") == "TENSOR_OP_ALLOW_CONVERSION"
    # notes unknown: the most permissive label the mode allows
    assert G.math_type_label(None, "strict", "float32") == "FMA"
    assert G.math_type_label(None, "tf32", "float32") == "TENSOR_OP"
    assert G.math_type_label(None, "strict", "float16") == "TENSOR_OP"
    assert G.math_type_label(None, "default", "float16") == "TENSOR_OP_ALLOW_CONVERSION"


def test_an_unknown_numerics_mode_is_refused():
    with pytest.raises(InputError):
        G.excluded_notes("fast", "float32")


@pytest.mark.parametrize("numerics, engines", [
    ("strict", {0, 1, 3, 9}), ("tf32", {0, 1, 3, 7, 9}), ("default", {0, 1, 3, 7, 9, 11}),
    ("strict-deterministic", {0, 1, 3}), ("tf32-deterministic", {0, 1, 3, 7}),
])
def test_measurements_only_use_engines_the_numerics_mode_admits(numerics, engines):
    src, *_ = source(MIXED)
    ms, skipped = src.measure("forward", P, OPS, WS, settings(numerics))
    assert {m.engine["id"] for m in ms} == engines
    for m in ms:
        assert G.admissible(m.extra["notes"], numerics, "float32")
        assert m.math_type == G.math_type_label(m.extra["notes"], numerics, "float32")
        assert m.extra["deterministic"] == ("NONDETERMINISTIC" not in m.extra["notes"])
    refused = {s.algo for s in skipped if s.reason == "deselected by numerical notes"}
    assert refused == {c.tag for cs in MIXED.values() for c in cs if c.eid not in engines}


def test_float16_strict_allows_tensor_cores_but_not_reduced_precision():
    lists = {"A": [Cfg(1, notes={"TENSOR_CORE"}), Cfg(2, notes={"TENSOR_CORE", "REDUCED_PRECISION_REDUCTION"}),
                   Cfg(3)]}
    src, *_ = source(lists)
    ms, _ = src.measure("forward", dataclasses.replace(P, dtype="float16"), OPS, WS, settings("strict"))
    assert {(m.engine["id"], m.math_type) for m in ms} == {(1, "TENSOR_OP"), (3, "FMA")}


# --- measurement bookkeeping ------------------------------------------------------------------------
def test_each_distinct_configuration_is_built_and_timed_once_in_heuristic_order():
    src, fe, timer, _ = source(MIXED)
    ms, skipped = src.measure("forward", P, OPS, WS, settings("default"))
    tags = [m.algo for m in ms]
    assert len(tags) == len(set(tags)) == 6          # eng7 is in lists A and B: measured once
    assert tags[0] == "eng1_k2=3_k13=1"               # knobs sorted in the identity and the algo
    assert ms[0].engine == {"id": 1, "knobs": {"2": 3, "13": 1}}
    assert [m.extra["heuristic_rank"] for m in ms] == list(range(6))
    assert fe.builds == 6
    assert {m.algo: m.time_ms for m in ms}["eng7"] == 0.5
    assert all(m.source == "graph" and m.micro_batch == 8 for m in ms)
    assert [t for t, _ in timer.calls].count("eng7") == 3   # quick sample: an untimed-for-use call and one timed; then the full timing


def test_a_first_call_as_long_as_the_trust_threshold_is_the_quick_sample_and_is_not_retimed():
    lists = {"A": [Cfg(1, ms=0.5, ws=0), Cfg(2, ms=3.0, ws=0)]}
    src, fe, timer, _ = source(lists)
    ms, _ = src.measure("forward", P, OPS, WS, settings(trust_estimate_ms=2.0, hopeless_factor=None))
    timing = {m.engine["id"]: (m.extra["timing"], m.time_ms) for m in ms}
    assert timing == {1: ("median", 0.5), 2: ("quick", 3.0)}
    assert [t for t, _ in timer.calls].count("eng2") == 1       # one call: its own first run is the estimate
    assert [t for t, _ in timer.calls].count("eng1") == 3       # two quick calls, then the median


def test_unsupported_runtime_compiled_and_oversized_engines_become_skipped_rows():
    lists = {"A": [Cfg(1), Cfg(2, supported=False), Cfg(3, behavior=["RUNTIME_COMPILATION"]),
                   Cfg(4, ws=2 << 30), Cfg(5, ws=1 << 20)]}
    src, *_ = source(lists)
    ms, skipped = src.measure("forward", P, OPS, WS, settings("strict", max_workspace=1 << 30))
    assert {m.engine["id"] for m in ms} == {1, 5}
    reasons = {s.algo: s.reason for s in skipped}
    assert reasons["eng2"].startswith("not supported: ")
    assert reasons["eng3"].startswith("runtime-compiled")
    assert reasons["eng4"] == "needs more workspace than the benchmark offers"
    src2, *_ = source(lists, runtime_compiled=True)
    assert 3 in {m.engine["id"] for m in src2.measure("forward", P, OPS, WS, settings("strict"))[0]}


def test_a_graph_configuration_that_cannot_be_captured_is_skipped_not_raised():
    def refuse(fn, repeat=1, **kw):
        if repeat > 1:   # the quick sample passes; the full (replayed) timing cannot capture
            raise CaptureError("cannot be captured into a CUDA graph: RuntimeError: pool allocation")
        return 0.5

    src = G.GraphSource(fe=FakeFrontend({"A": [Cfg(1)]}), handle_fn=lambda: 1, timer=refuse)
    ms, skipped = src.measure("forward", P, OPS, WS, BenchSettings("strict", repeat=3, timing="replay"))
    assert ms == [] and "cannot be captured" in skipped[0].reason


def test_no_heuristics_result_is_a_skipped_row_not_an_exception():
    def lists(op, n):
        raise RuntimeError("No valid engine configs for graph")

    fe = FakeFrontend({})
    fe.heuristics = lists
    src = G.GraphSource(fe=fe, handle_fn=lambda: 1, timer=lambda fn, **kw: 1.0)
    ms, skipped = src.measure("forward", P, OPS, WS, settings())
    assert ms == [] and "no engine configuration" in skipped[0].reason


def test_top_k_times_only_the_first_k_configurations_that_build():
    lists = {"A": [Cfg(1, supported=False)] + [Cfg(i, ms=10.0 - i) for i in range(2, 9)]}
    src, fe, *_ = source(lists, top_k=3)
    ms, skipped = src.measure("forward", P, OPS, WS, settings())
    assert [m.engine["id"] for m in ms] == [2, 3, 4]
    assert fe.builds == 3 and src.stats["configs_pruned"] == 4


def test_quick_margin_skips_the_full_timing_of_dominated_configurations_only():
    lists = {"A": [Cfg(1, ms=1.0, ws=0), Cfg(2, ms=5.0, ws=1 << 20), Cfg(3, ms=0.5, ws=8 << 20),
                   Cfg(4, ms=1.2, ws=0)]}
    src, fe, timer, _ = source(lists, quick_margin=1.5)
    ms, _ = src.measure("forward", P, OPS, WS, settings())
    timing = {m.engine["id"]: m.extra["timing"] for m in ms}
    # 2 is 5x slower than 1 with more workspace: dominated; 3 is fastest (more workspace); 4 is within the margin of 1
    assert timing == {1: "median", 2: "quick", 3: "median", 4: "median"}
    assert {m.engine["id"]: m.time_ms for m in ms}[2] == 5.0
    assert sum(1 for t, r in timer.calls if r > 1) == 3


def test_backward_filter_counts_the_accumulation_buffer_and_times_the_accumulating_path():
    lists = {"A": [Cfg(1, ws=1000), Cfg(2, ws=0)]}
    src, fe, timer, blends = source(lists)
    ms, _ = src.measure("backward_filter", P, OPS, WS, settings())
    dw_bytes = 32 * 16 * 3 * 3 * 4
    assert {m.engine["id"]: m.workspace_bytes for m in ms} == {1: 1024 + dw_bytes, 2: dw_bytes}
    assert all(m.extra["accumulate_ms"] == 0.01 for m in ms)
    runs = [e for e in fe.executions if e[0] == "backward_filter"]
    assert runs and all(pack[3] != OPS.out for *_, pack, _ in runs), "accumulating runs write the scratch"
    assert {(op, a, b) for op, _, _, a, b in blends} == {("backward_filter", 1.0, 1.0)}
    scratch = {pack[3] for _, _, cfg, pack, _ in runs if cfg.eid == 1}
    assert scratch == {WS + 1024}, "scratch sits right after the engine's (aligned) workspace"


def test_notes_are_probed_once_per_engine_and_reused_across_micro_batch_sizes():
    def lists(op, n):
        cfgs = [Cfg(1), Cfg(7, notes={"TENSOR_CORE"}), Cfg(9, notes={"NONDETERMINISTIC"})]
        return {"A": cfgs if n >= 4 else cfgs + [Cfg(12, notes={"TENSOR_CORE", "NONDETERMINISTIC"})]}

    src, fe, *_ = source(lists)
    probes_per_size = []
    for mb in (8, 4, 2):
        before = fe.graphs
        ms, _ = src.measure("forward", P.with_batch(mb), OPS, WS, settings("tf32"))
        probes_per_size.append(fe.graphs - before - 1)
        assert {m.engine["id"]: tuple(m.extra["notes"]) for m in ms} == {
            1: (), 7: ("TENSOR_CORE",), 9: ("NONDETERMINISTIC",),
            **({12: ("NONDETERMINISTIC", "TENSOR_CORE")} if mb == 2 else {})}
    assert probes_per_size == [2, 0, 2]   # tf32 leaves TENSOR_CORE and NONDETERMINISTIC to probe; eng12 is new at 2


def test_notes_that_cannot_be_lined_up_are_left_unknown_not_guessed():
    calls = {"n": 0}

    def lists(op, n):
        calls["n"] += 1
        order = [Cfg(1), Cfg(7, notes={"TENSOR_CORE"})]
        return {"A": order if calls["n"] == 1 else order[::-1]}   # a probe sees another order

    src, *_ = source(lists)
    ms, _ = src.measure("forward", P, OPS, WS, settings("tf32"))
    assert all("notes" not in m.extra for m in ms)
    assert {m.math_type for m in ms} == {"TENSOR_OP"}   # the most permissive label tf32 allows


# --- execution --------------------------------------------------------------------------------------
def _config(ident, ws):
    return Measurement(8, ident.tag, "FMA", 1.0, ws, "graph", ident.to_json())


def test_run_reuses_the_plan_built_while_measuring():
    src, fe, *_ = source(MIXED)
    ms, _ = src.measure("forward", P, OPS, WS, settings("strict"))
    builds = fe.builds
    src.run("forward", P, ms[0], OPS, WS, ms[0].workspace_bytes, 1.0, 0.0)
    assert fe.builds == builds
    assert fe.executions[-1][3] == {1: OPS.a, 2: OPS.b, 3: OPS.out}


def test_a_fresh_source_rebuilds_the_exact_configuration_from_the_identity():
    src, fe, *_ = source(MIXED)
    ident = G.EngineIdentity(1, ((2, 3), (13, 1)))
    src.run("forward", P, _config(ident, 1 << 20), OPS, WS, 1 << 20, 1.0, 0.0)
    op, n, cfg, pack, ws = fe.executions[-1]
    assert (op, n, cfg.tag, ws) == ("forward", 8, "eng1_k13=1_k2=3", WS)
    with pytest.raises(CudnnError, match="eng5_k1=1 is not among"):
        src.run("forward", P, _config(G.EngineIdentity(5, ((1, 1),)), 0), OPS, WS, 0, 1.0, 0.0)


def test_run_with_alpha_beta_writes_the_scratch_then_blends_into_the_output():
    src, fe, _, blends = source({"A": [Cfg(1, ws=100)]})
    ident = G.EngineIdentity(1)
    need = G.plan_workspace(100, "backward_filter", P)
    src.run("backward_filter", P, _config(ident, need), OPS, WS, need, 0.5, 1.0)
    assert fe.executions[-1][3][3] == WS + 256
    assert blends[-1] == ("backward_filter", WS + 256, OPS.out, 0.5, 1.0)
    src.run("backward_filter", P, _config(ident, need), OPS, WS, need, 1.0, 0.0)
    assert fe.executions[-1][3][3] == OPS.out and len(blends) == 1   # beta 0: straight into the output


def test_run_refuses_a_workspace_smaller_than_the_engine_needs():
    from ucudnn.errors import UcudnnError

    src, *_ = source({"A": [Cfg(1, ws=4096)]})
    with pytest.raises(UcudnnError, match="needs 4096 bytes"):
        src.run("forward", P, _config(G.EngineIdentity(1), 4096), OPS, WS, 1024, 1.0, 0.0)


# --- wiring -----------------------------------------------------------------------------------------
def test_sources_resolve_by_name_for_benchmarking_and_execution():
    from ucudnn.measure.benchmarking import resolve_sources
    from ucudnn.measure.sources import registry

    legacy, graph = resolve_sources("legacy, graph")
    assert (legacy.name, graph.name) == ("legacy", "graph")
    assert registry.get("graph") is graph, "execution finds the instance that measured"
    with pytest.raises(InputError) as e:
        resolve_sources(["legacy", "cublas"])
    assert "known: depthwise, direct, fft, fold, graph, legacy, mec, relayout, winograd" in str(e.value) and e.value.field == "source"


@pytest.mark.parametrize("argv, message", [
    (["--sources", "legacy,nope"], "--sources: unknown algorithm source 'nope'"),
    (["--sources", "legacy", "--graph-top-k", "4"], "--graph-top-k: only applies"),
    (["--sources", "graph", "--graph-top-k", "0"], "--graph-top-k: must be a positive integer"),
])
def test_bench_cli_refuses_bad_source_options_before_touching_a_gpu(argv, message, tmp_path, capsys):
    from ucudnn.cli import main

    code = main(["bench", "--problem", "n=8,c=3,h=8,k=4,r=3", "-o", str(tmp_path / "t.json")] + argv)
    assert code == 2
    assert message in capsys.readouterr().err


def test_graph_source_refuses_bad_settings():
    with pytest.raises(InputError, match="heuristic modes"):
        G.GraphSource(modes=("A", "C"))
    with pytest.raises(InputError):
        G.GraphSource(top_k=0)
    with pytest.raises(InputError):
        G.GraphSource(quick_margin=0.5)


def test_tensor_layout_gives_graph_api_dims_with_layout_strides():
    p = ConvProblem(2, 3, 5, 7, 4, 3, 3, layout="NHWC")
    lay = G.tensor_layout(p)
    assert lay["x"] == ([2, 3, 5, 7], [5 * 7 * 3, 1, 7 * 3, 3])
    assert lay["w"] == ([4, 3, 3, 3], [27, 1, 9, 3])
    q = ConvProblem(2, 4, 5, 7, 4, 3, 3, groups=2)
    assert G.tensor_layout(q)["w"] == ([4, 2, 3, 3], [18, 9, 3, 1])


# --- a table recorded on an H100 (benchmarks/graph_wr.py --tables-out) ----------------------------------
RECORDED = __import__("pathlib").Path(__file__).parent / "fixtures" / "alexnet-b256-float32-NHWC-strict-legacy-graph-h100.json.gz"


def test_a_recorded_strict_fp32_table_holds_only_fma_graph_engines_with_rebuildable_identities():
    t = BenchmarkTable.load(RECORDED)
    graph = [m for k in t.kernels for m in k.measurements if m.source == "graph"]
    assert t.numerics == "strict" and graph
    for m in graph:
        ident = G.EngineIdentity.from_json(m.engine)
        assert ident.tag == G.EngineIdentity.parse_tag(m.algo).tag   # the tag and the identity name one plan
        assert m.math_type == "FMA"                                   # strict fp32: no TF32 tensor-core engine
        assert "TENSOR_CORE" not in m.extra.get("notes", [])


def test_wr_at_64mib_on_a_recorded_table_stays_within_the_limit_and_beats_legacy_alone():
    from ucudnn.planning.planner import plan

    t = BenchmarkTable.load(RECORDED)
    legacy_only = BenchmarkTable(t.device, t.cudnn_version, [
        KernelBench(k.name, k.op, k.problem, [m for m in k.measurements if m.source == "legacy"], k.skipped,
                    k.benchmark_seconds) for k in t.kernels], t.numerics, dict(t.extra))
    both = plan(t, "wr", workspace_limit=64 << 20)
    assert all(k.workspace_bytes <= 64 << 20 and k.batch == 256 for k in both.kernels)
    assert any(c.source == "graph" for k in both.kernels for c in k.configs)
    assert both.total_time_ms < plan(legacy_only, "wr", workspace_limit=64 << 20).total_time_ms


def test_an_engines_first_execution_in_the_process_is_not_its_quick_sample():
    """The first run of an engine loads its kernels: it runs once untimed, then the trusted first timed call is
    the sample; at the next size the engine is warm and its first timed call is trusted at once."""
    lists = {"A": [Cfg(2, ms=3.0, ws=0)]}
    src, fe, timer, _ = source(lists)
    before = len(fe.executions)
    src.measure("forward", P, OPS, WS, settings(trust_estimate_ms=2.0, hopeless_factor=None))
    assert len(fe.executions) - before == 2                      # one untimed warm-up, one timed call
    assert [t for t, _ in timer.calls].count("eng2") == 1
    before = len(fe.executions)
    src.measure("forward", P.with_batch(P.n * 2), OPS, WS, settings(trust_estimate_ms=2.0, hopeless_factor=None))
    assert len(fe.executions) - before == 1                      # warm: its first timed call is the sample


def test_the_shortcut_executes_the_built_plan_on_the_callers_stream_and_declines_what_it_cannot_run(monkeypatch):
    """graph._direct: the frontend's C++ execute with (a, b, out) under the graph's uids, the workspace, the
    plan's index and this thread's handle bound to the caller's stream; False, nothing run, for misaligned
    operands, a workspace smaller than the engine's, or another device than the one prepared on."""
    from ucudnn.binding import gpu

    calls = []

    class Graph:
        def _execute_plan_at_index(self, ptrs, workspace, index, handle, *overrides):
            calls.append((ptrs, workspace, index, handle, overrides))

    device = [0]
    monkeypatch.setattr(gpu, "current_device", lambda: device[0])
    monkeypatch.setattr(gpu, "handle_on", lambda stream, dev: ("handle", stream, dev))
    ident = G.EngineIdentity(3, ())
    direct = G._direct(G._Built(Graph(), 2, 256), 0, ident)
    assert direct(4096, 8192, 12288, 65536, 256, 77) is True
    assert calls == [({G.UIDS[0]: 4096, G.UIDS[1]: 8192, G.UIDS[2]: 12288}, 65536, 2, ("handle", 77, 0),
                      (None, None, None))]
    assert direct(4096 + 4, 8192, 12288, 65536, 256, 77) is False      # misaligned a
    assert direct(4096, 8192, 12288, 65536, 255, 77) is False          # too little workspace
    device[0] = 1
    assert direct(4096, 8192, 12288, 65536, 256, 77) is False          # another device
    assert len(calls) == 1


def test_the_shortcuts_failures_are_cudnn_errors_naming_the_engine(monkeypatch):
    from ucudnn.binding import gpu

    class Graph:
        def _execute_plan_at_index(self, *a):
            raise RuntimeError("CUDNN_STATUS_EXECUTION_FAILED\nmore")

    monkeypatch.setattr(gpu, "current_device", lambda: 0)
    monkeypatch.setattr(gpu, "handle_on", lambda stream, dev: 1)
    direct = G._direct(G._Built(Graph(), 0, 0), 0, G.EngineIdentity(3, ()))
    with pytest.raises(CudnnError, match="eng3.*EXECUTION_FAILED"):
        direct(0, 0, 0, 0, 0, 0)
    assert G._direct(G._Built(object(), 0, 0), 0, G.EngineIdentity(3, ())) is None   # no frontend binding


def test_a_trusted_first_call_near_what_wr_already_has_is_timed_once_more():
    """A first call at a new size reads up to 13% high (H100): where a trusted one is within a factor ``NEAR_TIE`` of
    the best split of its size (here 2 x 1.5 ms at n = 8), either way, one more call decides, the smaller kept; a
    clear loser or winner keeps its one call.  At the kernel's full mini-batch too, where a split is no reference for dominance but is
    what WR weighs the row against."""
    from ucudnn.planning.table import Measurement

    lists = {"A": [Cfg(2, ms=3.2, ws=0), Cfg(3, ms=5.0, ws=0), Cfg(4, ms=2.2, ws=0)]}
    src, fe, timer, _ = source(lists)
    full = P.with_batch(2 * P.n)
    s = settings(trust_estimate_ms=2.0, hopeless_factor=None, prune_margin=None)
    s.split_margin = 1.5
    measured = [Measurement(P.n, "eng9", "FMA", 1.5, 0, "graph")]
    s.start_kernel(full, measured)
    src.measure("forward", full, OPS, WS, s)
    counts = {e: [t for t, _ in timer.calls].count(f"eng{e}") for e in (2, 3, 4)}
    assert counts == {2: 2, 3: 1, 4: 1}   # 3.2 within 1.15 x 3.0 ms: a second call; 5.0 and 2.2 are not near
    assert G.NEAR_TIE == 1.15


def test_each_row_records_the_host_work_of_its_own_last_timing():
    """``host_ms``: a row timed only by its quick sample keeps that sample's host work, a median row the median's
    (never another engine's); replayed timings record none (``ucudnn.binding.timing.HostRecorder``)."""
    import dataclasses

    from ucudnn.binding import timing

    lists = {"A": [Cfg(1, ms=1.0, ws=0), Cfg(2, ms=5.0, ws=1 << 20), Cfg(3, ms=0.5, ws=8 << 20)]}
    src, fe, timer, _ = source(lists, quick_margin=1.5)
    inner = src._timer

    def hosted(fn, repeat=5, **kw):
        ms = inner(fn, repeat=repeat, **kw)
        timing._last.host_ms = ms * (0.1 if repeat == 1 else 0.05)   # quick samples: 10%, medians: 5% of the time
        return ms

    src._timer = hosted
    ms, _ = src.measure("forward", P, OPS, WS, settings())
    got = {m.engine["id"]: (m.extra["timing"], m.extra["host_ms"]) for m in ms}
    assert got == {1: ("median", pytest.approx(0.05)), 2: ("quick", pytest.approx(0.5)),
                   3: ("median", pytest.approx(0.025))}
    src2, *_ = source(lists, quick_margin=1.5)
    src2._timer = hosted
    ms, _ = src2.measure("forward", P, OPS, WS, dataclasses.replace(settings(), timing="replay"))
    assert ms and all("host_ms" not in m.extra for m in ms)
