"""Issue 17 diagnosis: how fast the GEMMs of ``mec``'s configurations can run, by cuBLAS's default choice
(``cublasGemmStridedBatchedEx``) against every algorithm cuBLASLt's heuristic offers (timed, as Find would).

For every distinct conv kernel of a network (NHWC), op, variant and micro-batch size: each GEMM step of the mec
program timed alone (default choice, and the best cuBLASLt algorithm with the workspace it needs), plus the
ceiling of the same compute type on a large square GEMM.

    python benchmarks/gemm_probe.py --network alexnet --sizes 4,8 --compute 32F
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from core_wr import distinct_kernels  # noqa: E402

MiB = 1 << 20


# ---- cuBLASLt through ctypes: strided-batched matmuls, every algorithm its heuristic offers -------------------------
# Why here and not in ucudnn.binding: only this probe uses it.  cublasGemmStridedBatchedEx runs cuBLAS's one
# heuristic choice (its algo argument is ignored since Ampere); cuBLASLt lists several (tile shapes, split-K, with
# the workspace each needs), so the probe can time them as Find would.  Column-major, as cublas.gemm_strided_batched.
import ctypes
import threading
from dataclasses import dataclass
from typing import Any

from ucudnn.binding.cublas import COMPUTE_TYPES, DATA_TYPES, OPERATIONS, CublasError

# cublasLtMatmulDescAttributes_t, cublasLtMatrixLayoutAttribute_t, cublasLtMatmulPreferenceAttributes_t
_DESC_TRANSA, _DESC_TRANSB = 3, 4
_LAYOUT_BATCH_COUNT, _LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
_PREF_MAX_WORKSPACE_BYTES = 1
_SCALE_TYPE = {"float32": 0, "float16": 0, "bfloat16": 0}      # CUDA_R_32F scalars under the 32F compute types


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


_lock = threading.Lock()
_lib: Any = None
_handles: dict[int, int] = {}


def _library() -> Any:
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                from ucudnn.binding.cublas import load
                lib = load("libcublasLt")
                vp, i, sz, u64, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int64
                sigs = {
                    "cublasLtCreate": [ctypes.POINTER(vp)],
                    "cublasLtMatmulDescCreate": [ctypes.POINTER(vp), i, i],
                    "cublasLtMatmulDescSetAttribute": [vp, i, vp, sz],
                    "cublasLtMatmulDescDestroy": [vp],
                    "cublasLtMatrixLayoutCreate": [ctypes.POINTER(vp), i, u64, u64, i64],
                    "cublasLtMatrixLayoutSetAttribute": [vp, i, vp, sz],
                    "cublasLtMatrixLayoutDestroy": [vp],
                    "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(vp)],
                    "cublasLtMatmulPreferenceSetAttribute": [vp, i, vp, sz],
                    "cublasLtMatmulPreferenceDestroy": [vp],
                    "cublasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, i, ctypes.POINTER(_Heuristic),
                                                       ctypes.POINTER(i)],
                    "cublasLtMatmul": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, ctypes.POINTER(_Algo), vp, sz,
                                       vp],
                }
                for fname, args in sigs.items():
                    f = getattr(lib, fname)
                    f.argtypes, f.restype = args, ctypes.c_int
                _lib = lib
    return _lib


def _check(call: str, status: int) -> None:
    if status != 0:
        raise CublasError(f"{call} failed: status {status}")


def handle(device: int | None = None) -> int:
    """The cuBLASLt handle of ``device`` (default: CuPy's current device), created once."""
    from ucudnn.binding.gpu import current_device

    dev = current_device() if device is None else device
    h = _handles.get(dev)
    if h is None:
        lib = _library()
        out = ctypes.c_void_p()
        _check("cublasLtCreate", lib.cublasLtCreate(ctypes.byref(out)))
        h = _handles.setdefault(dev, int(out.value or 0))
    return h


@dataclass(frozen=True)
class Algorithm:
    """One cuBLASLt algorithm for a :class:`Matmul`: its opaque bytes, the workspace it needs and the heuristic's
    waves count (how many times the grid fills the GPU: under 1 leaves SMs idle)."""

    data: tuple[int, ...]
    workspace: int
    waves: float

    def struct(self) -> _Algo:
        a = _Algo()
        a.data[:] = self.data
        return a


class Matmul:
    """A prepared column-major strided-batched ``C = alpha * op(A) @ op(B) + beta * C`` (C and D share memory):
    descriptors built once, run many times with any pointers of the same shape."""

    def __init__(self, dtype: str, compute: str, transa: str, transb: str, m: int, n: int, k: int, lda: int,
                 ldb: int, ldc: int, stride_a: int, stride_b: int, stride_c: int, batch: int):
        lib = _library()
        self._lib = lib
        dt, ct = DATA_TYPES[dtype], COMPUTE_TYPES[compute]
        self.desc = ctypes.c_void_p()
        _check("cublasLtMatmulDescCreate", lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), ct,
                                                                       _SCALE_TYPE[dtype]))
        for attr, op in ((_DESC_TRANSA, transa), (_DESC_TRANSB, transb)):
            v = ctypes.c_int32(OPERATIONS[op])
            _check("cublasLtMatmulDescSetAttribute",
                   lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(v), 4))
        ta, tb = transa == "T", transb == "T"
        self.layouts = []
        for rows, cols, ld, stride in (((k, m) if ta else (m, k)) + (lda, stride_a),
                                       ((n, k) if tb else (k, n)) + (ldb, stride_b), (m, n, ldc, stride_c)):
            lay = ctypes.c_void_p()
            _check("cublasLtMatrixLayoutCreate", lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dt, rows, cols, ld))
            cnt, off = ctypes.c_int32(batch), ctypes.c_int64(stride)
            _check("cublasLtMatrixLayoutSetAttribute",
                   lib.cublasLtMatrixLayoutSetAttribute(lay, _LAYOUT_BATCH_COUNT, ctypes.byref(cnt), 4))
            _check("cublasLtMatrixLayoutSetAttribute",
                   lib.cublasLtMatrixLayoutSetAttribute(lay, _LAYOUT_STRIDED_BATCH_OFFSET, ctypes.byref(off), 8))
            self.layouts.append(lay)

    def algorithms(self, max_workspace: int, count: int = 16) -> list[Algorithm]:
        """Up to ``count`` algorithms cuBLASLt's heuristic offers within ``max_workspace`` bytes, best guess first."""
        lib = self._lib
        pref = ctypes.c_void_p()
        _check("cublasLtMatmulPreferenceCreate", lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)))
        try:
            ws = ctypes.c_uint64(max_workspace)
            _check("cublasLtMatmulPreferenceSetAttribute", lib.cublasLtMatmulPreferenceSetAttribute(
                pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws), 8))
            results = (_Heuristic * count)()
            found = ctypes.c_int(0)
            a, b, c = self.layouts
            status = lib.cublasLtMatmulAlgoGetHeuristic(ctypes.c_void_p(handle()), self.desc, a, b, c, c, pref, count,
                                                        results, ctypes.byref(found))
            if status == 15:      # CUBLAS_STATUS_NOT_SUPPORTED: no algorithm for this problem
                return []
            _check("cublasLtMatmulAlgoGetHeuristic", status)
            return [Algorithm(tuple(r.algo.data), int(r.workspace_size), float(r.waves))
                    for r in results[:found.value] if r.state == 0]
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)

    def run(self, algo: _Algo, alpha: int, a: int, b: int, beta: int, c: int, workspace: int, workspace_bytes: int,
            stream: int) -> None:
        """Enqueue on ``stream``; ``alpha`` / ``beta``: host addresses of float32 scalars; ``algo``:
        :meth:`Algorithm.struct` (built once by the caller)."""
        la, lb, lc = self.layouts
        _check("cublasLtMatmul", self._lib.cublasLtMatmul(
            ctypes.c_void_p(handle()), self.desc, ctypes.c_void_p(alpha), ctypes.c_void_p(a), la, ctypes.c_void_p(b),
            lb, ctypes.c_void_p(beta), ctypes.c_void_p(c), lc, ctypes.c_void_p(c), lc, ctypes.byref(algo),
            ctypes.c_void_p(workspace or None), workspace_bytes, ctypes.c_void_p(stream or None)))

    def __del__(self) -> None:
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        for lay in getattr(self, "layouts", []):
            lib.cublasLtMatrixLayoutDestroy(lay)
        if getattr(self, "desc", None):
            lib.cublasLtMatmulDescDestroy(self.desc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--network", default="alexnet")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--sizes", default="4,8")
    ap.add_argument("--compute", default="32F")
    ap.add_argument("--variants", default="A")
    ap.add_argument("--max-workspace", default="32MiB")
    ap.add_argument("--algos", type=int, default=24)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()

    import cupy as cp
    import numpy as np

    from ucudnn.binding import cublas
    from ucudnn.kernels.mec import Gemm, MecGeometry, program, refusal
    from ucudnn.measure.sources.base import BenchSettings, time_config
    from ucudnn.planning.network import load_network
    from ucudnn.units import parse_size

    prov = provenance()
    max_ws = parse_size(args.max_workspace)
    settings = BenchSettings("strict", repeat=5, warmup=2, min_sample_ms=0.5, hopeless_factor=None,
                             kernel_budget_s=None)
    h = cublas.handle()
    stream = cp.cuda.get_current_stream().ptr
    cublas.bind(h, stream)
    scal = np.array([1.0, 0.0, 1.0], np.float32)
    alpha, beta = scal.ctypes.data, scal.ctypes.data + 4
    ws = cp.empty(max_ws, cp.uint8)
    ct = cublas.COMPUTE_TYPES[args.compute]
    f32 = cublas.DATA_TYPES["float32"]

    # ceiling: 4096^3
    big = [cp.ones((4096, 4096), cp.float32) for _ in range(3)]

    def square() -> None:
        cublas.gemm_strided_batched(h, 0, 0, 4096, 4096, 4096, alpha, big[0].data.ptr, f32, 4096, 0,
                                    big[1].data.ptr, f32, 4096, 0, beta, big[2].data.ptr, f32, 4096, 0, 1, ct)
    sq_ms = time_config(square, settings)
    prov["square_4096_tflops"] = round(2 * 4096 ** 3 / sq_ms / 1e9, 2)
    print("square 4096 TFLOPS", prov["square_4096_tflops"], flush=True)

    kernels = distinct_kernels(load_network(args.network).kernels(args.batch, "float32", "NHWC"))
    rows = []
    for spec in kernels:
        for n in [int(s) for s in args.sizes.split(",")]:
            p = spec.problem.with_batch(n)
            g = MecGeometry.of(p)
            for v in args.variants.split(","):
                if refusal(g, spec.op, v, n):
                    continue
                prog = program(g, spec.op, v, n)
                gemms = [s for s in prog.steps if isinstance(s, Gemm)]
                # one buffer per operand name, large enough for every GEMM's reach
                reach: dict[str, int] = {}
                for gm in gemms:
                    for name, off, rows_, cols, ld, stride in (
                            (gm.a, gm.a_offset, *((gm.k, gm.m) if gm.trans_a else (gm.m, gm.k)), gm.lda, gm.stride_a),
                            (gm.b, gm.b_offset, *((gm.n, gm.k) if gm.trans_b else (gm.k, gm.n)), gm.ldb, gm.stride_b),
                            (gm.c, gm.c_offset, gm.m, gm.n, gm.ldc, gm.stride_c)):
                        last = off + (gm.batch - 1) * stride + (rows_ - 1) * ld + cols
                        reach[name] = max(reach.get(name, 0), last)
                bufs = {name: cp.zeros(size, cp.float32) for name, size in reach.items()}
                default_ms = best_ms = 0.0
                best_ws = 0
                n_algos = []
                flops = 0
                for gm in gemms:
                    cm = gm.column_major()
                    (an, ao), (bn, bo), (cn, co) = cm["A"], cm["B"], cm["C"]
                    pa, pb, pc = bufs[an].data.ptr + 4 * ao, bufs[bn].data.ptr + 4 * bo, bufs[cn].data.ptr + 4 * co
                    flops += 2 * gm.m * gm.n * gm.k * gm.batch

                    def ex(cm=cm, pa=pa, pb=pb, pc=pc) -> None:
                        cublas.gemm_strided_batched(h, cublas.OPERATIONS[cm["transa"]],
                                                    cublas.OPERATIONS[cm["transb"]], cm["m"], cm["n"], cm["k"],
                                                    alpha, pa, f32, cm["lda"], cm["strideA"], pb, f32, cm["ldb"],
                                                    cm["strideB"], beta, pc, f32, cm["ldc"], cm["strideC"],
                                                    cm["batchCount"], ct)
                    default_ms += time_config(ex, settings)
                    mm = Matmul("float32", args.compute, cm["transa"], cm["transb"], cm["m"], cm["n"],
                                         cm["k"], cm["lda"], cm["ldb"], cm["ldc"], cm["strideA"], cm["strideB"],
                                         cm["strideC"], cm["batchCount"])
                    algos = mm.algorithms(max_ws, args.algos)
                    n_algos.append(len(algos))
                    best = None
                    for al in algos:
                        st = al.struct()

                        def lt(mm=mm, st=st, pa=pa, pb=pb, pc=pc, need=al.workspace) -> None:
                            mm.run(st, alpha, pa, pb, beta, pc, ws.data.ptr, need, stream)
                        try:
                            t = time_config(lt, settings)
                        except Exception as e:  # noqa: BLE001
                            print("algo failed", e, flush=True)
                            continue
                        if best is None or t < best[0]:
                            best = (t, al.workspace)
                    if best is not None:
                        best_ms += best[0]
                        best_ws = max(best_ws, best[1])
                    else:
                        best_ms = float("nan")
                row = {"kernel": spec.name, "op": spec.op, "n": n, "variant": v, "gemm_calls": len(gemms),
                       "gflop": round(flops / 1e9, 3), "default_ms": round(default_ms, 4),
                       "lt_best_ms": round(best_ms, 4), "lt_workspace_bytes": best_ws, "lt_algos": n_algos,
                       "default_tflops": round(flops / default_ms / 1e9, 2),
                       "lt_tflops": round(flops / best_ms / 1e9, 2) if best_ms == best_ms else None}
                rows.append(row)
                print(row, flush=True)
    doc = {"provenance": prov, "network": args.network, "compute": args.compute, "rows": rows}
    write(args.out, f"gemm_probe_{args.network}_{args.compute}", doc, markdown(prov, doc))


def markdown(prov: dict, doc: dict) -> str:
    lines = [md_header(f"mec's GEMMs: cuBLAS default vs best cuBLASLt algorithm, {doc['network']} "
                       f"float32 NHWC, compute {doc['compute']}", prov),
             f"Ceiling (4096^3, same compute type): {prov.get('square_4096_tflops')} TFLOPS.", "",
             "| kernel | n | variant | GEMM calls | GFLOP | default ms (TFLOPS) | best cuBLASLt ms (TFLOPS) | its workspace MiB |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        lines.append(f"| {r['kernel']} | {r['n']} | {r['variant']} | {r['gemm_calls']} | {r['gflop']} | "
                     f"{r['default_ms']} ({r['default_tflops']}) | {r['lt_best_ms']} ({r['lt_tflops']}) | "
                     f"{r['lt_workspace_bytes'] / MiB:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
