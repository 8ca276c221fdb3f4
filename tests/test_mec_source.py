"""The mec source's pure-Python side without a GPU: every configuration's program (steps + workspace) against a
float64 direct convolution, run both as row-major GEMMs and as the column-major calls cuBLAS receives; exact
workspace sizes; numerics -> cuBLAS compute types and labels; the tuned threshold's rule; skip reasons."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import as_strided
from test_mec import _operands, direct_backward_data, direct_backward_filter, direct_forward, problems
from ucudnn.kernels.mec import (MAX_GEMM_CALLS, OPERANDS, VARIANTS, WORKSPACE_ALIGN, Gemm, GatherDx, Lower,
                                MecGeometry, Swap, program, refusal, run_program, swap_word)

from ucudnn import numerics as num
from ucudnn.binding import cublas
from ucudnn.errors import InputError
from ucudnn.measure.sources.base import BenchSettings, Operands
from ucudnn.measure.sources.mec import (MecSource, compute_for, problem_refusal, threshold_from, tuning_problem)
from ucudnn.problem import ConvProblem


# ---- cuBLAS's view of a GEMM: the column-major arguments, executed as the library reads them ----------------------
def _col(buf: np.ndarray, off: int, rows: int, cols: int, ld: int, stride: int, batch: int) -> np.ndarray:
    e = buf.itemsize
    assert ld >= rows, f"leading dimension {ld} < {rows} rows: cuBLAS refuses it"
    last = off + (batch - 1) * stride + (cols - 1) * ld + rows
    assert 0 <= off and last <= buf.size, "operand outside its buffer"
    return as_strided(buf[off:], (batch, rows, cols), (stride * e, e, ld * e))


def run_column_major(gemms: list[Gemm], bufs: dict[str, np.ndarray], alpha: float, beta: float) -> None:
    for gm in gemms:
        cm = gm.column_major()
        (an, ao), (bn, bo), (cn, co) = cm["A"], cm["B"], cm["C"]
        m, n, k, batch = cm["m"], cm["n"], cm["k"], cm["batchCount"]
        a = _col(bufs[an], ao, *((k, m) if cm["transa"] == "T" else (m, k)), cm["lda"], cm["strideA"], batch)
        b = _col(bufs[bn], bo, *((n, k) if cm["transb"] == "T" else (k, n)), cm["ldb"], cm["strideB"], batch)
        a = a.transpose(0, 2, 1) if cm["transa"] == "T" else a
        b = b.transpose(0, 2, 1) if cm["transb"] == "T" else b
        al = alpha if gm.alpha is None else gm.alpha
        bt = beta if gm.beta is None else gm.beta
        out = bufs[cn]
        for i in range(batch):
            c = as_strided(out[co + i * cm["strideC"]:], (m, n), (out.itemsize, cm["ldc"] * out.itemsize))
            c[...] = al * (a[i] @ b[i]) + (bt * c if bt != 0 else 0)


def _expected(op, g, n, x, w, dy, out, alpha, beta):
    ref = {"forward": lambda: direct_forward(x, w, g), "backward_data": lambda: direct_backward_data(dy, w, g),
           "backward_filter": lambda: direct_backward_filter(x, dy, g)}[op]()
    return alpha * ref + (beta * out if beta != 0 else 0)


@settings(max_examples=50, deadline=None)
@given(problems(), st.sampled_from(sorted(VARIANTS)), st.sampled_from("AB"), st.sampled_from(["row", "column"]),
       st.sampled_from([(1.0, 0.0), (-0.5, 1.0), (2.0, 0.25)]))
def test_every_program_computes_the_convolution(nproblem, op, variant, how, scalars):
    n, g = nproblem
    alpha, beta = scalars
    if op == "forward" and variant == "A":
        beta = 0.0   # the source runs B's GEMMs when beta != 0 (tested on the GPU)
    why = refusal(g, op, variant, n)
    if why:
        with pytest.raises(InputError, match="variant"):
            program(g, op, variant, n)
        return
    x, w, dy = _operands(n, g, 4)
    operands = {"x": x, "w": w, "y": dy, "dy": dy, "dx": x, "dw": w}
    out_name = OPERANDS[op][2]
    out = np.full(operands[out_name].shape, np.nan) if beta == 0 else operands[out_name] + 1.0
    flat = {name: np.ascontiguousarray(operands[name]).reshape(-1).copy() for name in OPERANDS[op][:2]}
    flat[out_name] = out.reshape(-1).copy()
    run_program(program(g, op, variant, n, 8), g, flat, alpha, beta,
                gemm=run_column_major if how == "column" else None)
    np.testing.assert_allclose(flat[out_name].reshape(out.shape), _expected(op, g, n, x, w, dy, out, alpha, beta),
                               rtol=1e-11, atol=1e-11)


@settings(max_examples=40, deadline=None)
@given(problems(), st.sampled_from([2, 4]))
def test_workspace_is_the_lowered_buffer_plus_the_swapped_dy_exactly(nproblem, itemsize):
    n, g = nproblem
    lowered = g.lowered_elements(n) * itemsize
    dy = n * g.p * g.q * g.k * itemsize
    aligned = -(-lowered // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
    for op, variants in VARIANTS.items():
        for v in variants:
            if refusal(g, op, v, n):
                continue
            prog = program(g, op, v, n, itemsize)
            swapped = op != "forward" and v == "A" and n > 1
            assert prog.workspace_bytes == (aligned + dy if swapped else lowered), (op, v)
            assert [s[1] % WORKSPACE_ALIGN for s in prog.segments] == [0] * len(prog.segments)
            assert all(isinstance(s, Swap) for s in prog.steps if isinstance(s, Swap)) and \
                sum(isinstance(s, Swap) for s in prog.steps) == (1 if swapped or (op, v) == ("forward", "A") else 0)


def test_gemm_calls_per_variant_follow_the_batching():
    g = MecGeometry(64, 96, 27, 27, 256, 5, 5, (2, 2))              # AlexNet conv2: P = Q = 27
    assert program(g, "forward", "A", 64).gemm_calls == 1
    assert program(g, "forward", "B", 64).gemm_calls == 27           # one per row, all samples batched
    assert program(g, "backward_data", "A", 64).gemm_calls == 5      # ceil(R / sh) strided batches
    assert program(g, "backward_filter", "A", 64).gemm_calls == 27   # one per output row, over n*Q
    assert "GEMM calls" in refusal(g, "backward_filter", "B", 64)
    assert program(g, "backward_filter", "B", 2).gemm_calls == 54 <= MAX_GEMM_CALLS
    one = program(g, "backward_data", "A", 1)                        # n = 1: dy is already h-n-w-c
    assert not any(isinstance(s, Swap) for s in one.steps) and [s[0] for s in one.segments] == ["dL"]
    assert isinstance(one.steps[-1], GatherDx)
    assert isinstance(program(g, "backward_filter", "A", 3).steps[0], Lower)


def test_refusals_name_the_reason_and_bad_arguments_name_the_field():
    many_filters = MecGeometry(4, 3, 8, 8, 512, 1, 1)
    assert "|y|" in refusal(many_filters, "forward", "A", 4)
    g = MecGeometry(2, 3, 9, 8, 5, 3, 2, (1, 1), (2, 1))
    assert "n = 1" in refusal(g, "backward_filter", "B", 1)
    for args, field in ((("sideways", "A", 2), "op"), (("forward", "C", 2), "variant"), (("forward", "A", 0), "n")):
        with pytest.raises(InputError) as e:
            refusal(g, *args)
        assert e.value.field == field


def test_swap_word_is_the_widest_the_row_and_both_pointers_allow():
    assert swap_word(64, 256, 512) == 16
    assert swap_word(64, 256, 520) == 8
    assert swap_word(12, 0, 0) == 4
    assert swap_word(6, 2, 4) == 2
    with pytest.raises(InputError):
        swap_word(3, 0, 0)


# ---- numerics -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("numerics", ["strict", "tf32", "default", "strict-deterministic", "tf32-deterministic"])
def test_compute_types_and_labels_are_what_the_numerics_allow(numerics, dtype):
    compute, label = cublas.compute_type(numerics, dtype)
    assert label in num.allowed_math_types(numerics, dtype)
    assert compute in cublas.COMPUTE_TYPES
    assert compute_for(label, dtype) == compute   # a table row alone rebuilds its launch
    if dtype == "float32" and numerics.startswith("strict"):
        assert (compute, label) == ("32F_PEDANTIC", "FMA")     # never TF32, whatever the handle's math mode
    if dtype != "float32":
        assert compute == "32F"                                # tensor cores, FP32 accumulation
    assert num.inferred(dtype, [label]) in (num.normalize(None, dtype), "tf32")


def test_compute_for_refuses_labels_mec_never_records():
    with pytest.raises(InputError) as e:
        compute_for("TENSOR_OP_ALLOW_CONVERSION", "float32")
    assert e.value.field == "math_type"
    with pytest.raises(InputError):
        compute_for("FMA", "float16")


# ---- the seed's threshold ---------------------------------------------------------------------------------------
def test_threshold_minimises_the_summed_time_of_the_rule():
    assert threshold_from({7: (1.0, 2.0), 14: (1.0, 2.0), 56: (3.0, 2.0), 224: (9.0, 4.0)}) == 14
    assert threshold_from({7: (3.0, 2.0), 14: (3.0, 2.0)}) == 0                   # B everywhere
    assert threshold_from({7: (1.0, 2.0), 14: (1.0, 2.0)}) == 14                  # A everywhere
    assert threshold_from({7: (1.0, 2.0), 14: (5.0, 2.0), 28: (1.0, 2.0)}) == 7   # 1+2+2 beats 6, 8 and 7
    assert threshold_from({7: (2.0, 2.0)}) == 0                                    # ties: the smaller T


def test_tuning_problems_fit_solution_a_and_keep_the_work_level():
    for q in (7, 14, 28, 56, 112, 224):
        p = tuning_problem(q, "float32")
        g = MecGeometry.of(p)
        assert g.q == q and g.solution_a_allowed(p.n) and g.lowered_bytes(p.n) < 64 << 20


# ---- the source without a GPU -------------------------------------------------------------------------------------
REFUSED = {
    "NHWC": ConvProblem(8, 3, 32, 32, 16, 3, 3, layout="NCHW"),
    "grouped": ConvProblem(8, 4, 32, 32, 16, 3, 3, layout="NHWC", groups=2),
    "dilated": ConvProblem(8, 3, 32, 32, 16, 3, 3, layout="NHWC", dilation=(2, 2)),
    "bfloat16": ConvProblem(8, 3, 32, 32, 16, 3, 3, layout="NHWC", dtype="bfloat16"),
}


@pytest.mark.parametrize("word", sorted(REFUSED))
def test_unsupported_problems_are_skipped_with_the_reason(word):
    problem = REFUSED[word]
    assert word in problem_refusal(problem)
    for op in VARIANTS:
        ms, sk = MecSource().measure(op, problem, Operands(0, 0, 0), 0, BenchSettings("strict"))
        assert ms == [] and len(sk) == 1 and word in sk[0].reason and sk[0].reason.startswith("mec: ")
    with pytest.raises(InputError):
        MecSource().prepare("forward", problem, None)


def test_nchw_reason_points_at_relayout():
    assert "relayout" in problem_refusal(REFUSED["NHWC"])


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None,
                    reason="with a GPU this would launch on null pointers (the GPU tests cover measure)")
def test_measure_without_a_gpu_returns_skipped_rows_instead_of_raising():
    problem = ConvProblem(4, 3, 16, 16, 8, 3, 3, pad=1, layout="NHWC")
    for source in (MecSource(), MecSource(threshold=100)):
        for op in VARIANTS:
            ms, sk = source.measure(op, problem, Operands(0, 0, 0), 0, BenchSettings("strict"))
            assert ms == [] and sk and all(s.reason.startswith("mec: ") for s in sk)


def test_variants_follow_the_seed_rule_unless_both_are_asked_for():
    small = ConvProblem(32, 64, 56, 56, 64, 3, 3, pad=1, layout="NHWC")   # Q = 56
    assert MecSource().variants("forward", small, 100) == (["A"], [])
    assert MecSource().variants("forward", small, 55) == (["B"], [])
    assert MecSource(forward="both").variants("forward", small, 55)[0] == ["B", "A"]
    many_filters = ConvProblem(4, 3, 8, 8, 512, 1, 1, layout="NHWC")
    runs, skipped = MecSource(forward="both").variants("forward", many_filters, 100)
    assert runs == ["B"] and [s.algo for s in skipped] == ["mec-A"] and "|y|" in skipped[0].reason
    runs, skipped = MecSource().variants("backward_filter", small.with_batch(1), None)
    assert runs == ["A"] and skipped[0].algo == "mec-B"
    assert MecSource().variants("backward_data", small, None) == (["A", "B"], [])


def test_constructor_validates_its_arguments():
    with pytest.raises(InputError) as e:
        MecSource(forward="sometimes")
    assert e.value.field == "forward"
    with pytest.raises(InputError) as e:
        MecSource(threshold=-1)
    assert e.value.field == "threshold"


def test_the_registry_builds_the_mec_source():
    from ucudnn.measure.sources import registry

    assert isinstance(registry.get("mec"), MecSource) and registry.get("mec").name == "mec"


@pytest.mark.parametrize("source_module", ["mec", "winograd"])
def test_own_kernel_sources_never_raise_out_of_measure_a_refusal_or_failure_is_a_skipped_row(source_module,
                                                                                              monkeypatch):
    """ucudnn's own kernels' sources answer every problem with rows: one they refuse, and one whose measurement
    fails unexpectedly (a compile error, a launch failure), each as one Skipped row naming the source and why."""
    import importlib

    mod = importlib.import_module(f"ucudnn.measure.sources.{source_module}")
    source = mod.MecSource() if source_module == "mec" else mod.WinogradSource()
    p = ConvProblem(3, 8, 12, 12, 8, 3, 3, (1, 1), dtype="float32", layout="NHWC")
    settings_ = BenchSettings("strict")
    monkeypatch.setattr(mod, "problem_refusal", lambda *a: "not this shape")
    measured, skipped = source.measure("forward", p, Operands(0, 0, 0), 0, settings_)
    assert measured == [] and [(s.micro_batch, s.reason) for s in skipped] == [(3, f"{source_module}: not this shape")]
    monkeypatch.setattr(mod, "problem_refusal", lambda *a: None)
    monkeypatch.setattr(type(source), "_measure", lambda *a: 1 / 0)
    measured, skipped = source.measure("forward", p, Operands(0, 0, 0), 0, settings_)
    assert measured == [] and len(skipped) == 1 and skipped[0].reason.startswith(f"{source_module}: ZeroDivisionError")


def test_cublas_libraries_load_by_soname_cuda13_first_after_cupys_handle(monkeypatch):
    """The ctypes binding opens the copy CuPy loaded: CuPy's handle first, then the sonames newest first."""
    import ctypes

    events: list[str] = []
    monkeypatch.setattr(cublas, "handle", lambda: events.append("handle") or 1)

    def cdll(name):
        events.append(name)
        if not name.endswith(".so.12"):
            raise OSError(f"{name}: cannot open shared object file")
        return name

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    assert cublas.load("libcublasLt") == "libcublasLt.so.12"
    assert events == ["handle", "libcublasLt.so.13", "libcublasLt.so.12"]
    monkeypatch.setattr(ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError(f"{name}: missing")))
    with pytest.raises(cublas.CublasError, match="libcublas could not be loaded: libcublas.so.13: missing"):
        cublas.load("libcublas")


def test_a_binding_without_the_math_mode_getter_says_so(monkeypatch):
    monkeypatch.setattr(cublas, "_impl", {"math_mode": None, "impl": lambda: "cupy_backends.cuda.libs.cublas"})
    with pytest.raises(cublas.CublasError, match="cannot read a handle's math mode"):
        cublas.math_mode(1)
