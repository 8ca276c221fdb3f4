"""Issue 17 diagnosis: what cuBLAS compute type the ``mec`` source's FP32 strict GEMMs should run under.

For every distinct conv kernel of a network (NHWC), every op and variant, at a few micro-batch sizes, times mec's
whole configuration (lowering, GEMMs, gather) under each candidate compute type, and checks the forward and
backward-data results of each against a float64 reference (max error relative to the reference's largest value):

* ``32F_PEDANTIC`` -- what the source runs for ``strict`` today;
* ``32F`` on a handle in ``CUBLAS_DEFAULT_MATH`` -- FP32 inputs and accumulation, no TF32 (cuBLAS uses TF32 only
  under ``32F_FAST_TF32`` or a handle in ``CUBLAS_TF32_TENSOR_OP_MATH``);
* ``32F_FAST_TF32`` -- TF32, the ``tf32`` numerics' choice, for the error scale TF32 shows.

    python benchmarks/mec_compute.py --network alexnet --batch 256 --sizes 4,8,16
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from core_wr import distinct_kernels  # noqa: E402

COMPUTES = ("32F_PEDANTIC", "32F", "32F_FAST_TF32")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--network", default="alexnet")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--sizes", default="4,8,16")
    ap.add_argument("--computes", default=",".join(COMPUTES))
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()

    import cupy as cp

    from ucudnn.binding import cublas
    from ucudnn.kernels.mec import VARIANTS, MecGeometry, program, refusal
    from ucudnn.measure.sources.base import BenchSettings, Operands, time_config
    from ucudnn.measure.sources.mec import _launch
    from ucudnn.planning.network import load_network

    prov = provenance()
    kernels = distinct_kernels(load_network(args.network).kernels(args.batch, "float32", "NHWC"))
    computes = args.computes.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    settings = BenchSettings("strict", repeat=5, warmup=2, min_sample_ms=1.0, hopeless_factor=None,
                             kernel_budget_s=None)
    h = cublas.handle()
    prov["cublas_math_mode"] = cublas.math_mode(h)
    rng = cp.random.default_rng(7)
    rows = []
    for spec in kernels:
        op = spec.op
        for n in sizes:
            p = spec.problem.with_batch(n)
            g = MecGeometry.of(p)
            a_shape, b_shape, o_shape = {"forward": (p.x_shape(), p.w_shape(), p.y_shape()),
                                         "backward_data": (p.w_shape(), p.y_shape(), p.x_shape()),
                                         "backward_filter": (p.x_shape(), p.y_shape(), p.w_shape())}[op]
            a = rng.standard_normal(a_shape, dtype="float32")
            b = rng.standard_normal(b_shape, dtype="float32")
            out = cp.zeros(o_shape, cp.float32)
            ref = reference(op, cp.asnumpy(a), cp.asnumpy(b), p) if n <= sizes[0] else None
            for v in VARIANTS[op]:
                why = refusal(g, op, v, n)
                if why:
                    continue
                ws_bytes = program(g, op, v, n).workspace_bytes
                ws = cp.empty(max(ws_bytes, 1), cp.uint8)
                row = {"kernel": spec.name, "op": op, "n": n, "variant": v, "workspace_bytes": ws_bytes,
                       "gemm_calls": program(g, op, v, n).gemm_calls}
                for c in computes:
                    launch = _launch(g, op, v, c)
                    ops = Operands(a.data.ptr, b.data.ptr, out.data.ptr)
                    ms = time_config(lambda: launch(ops, ws.data.ptr, ws_bytes, 1.0, 0.0), settings)
                    row[f"ms_{c}"] = round(ms, 4)
                    row[f"us_per_sample_{c}"] = round(1000 * ms / n, 2)
                    if ref is not None:
                        out.fill(0)
                        launch(ops, ws.data.ptr, ws_bytes, 1.0, 0.0)
                        got = cp.asnumpy(out).astype(np.float64)
                        row[f"err_{c}"] = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
                rows.append(row)
                print(row, flush=True)
    doc = {"provenance": prov, "network": args.network, "batch": args.batch, "sizes": sizes, "computes": computes,
           "rows": rows}
    write(args.out, f"mec_compute_{args.network}", doc, markdown(prov, doc))


def reference(op: str, a: np.ndarray, b: np.ndarray, p) -> np.ndarray:
    """float64 result of ``op`` on NHWC operands (cuDNN's operand order): kernels.direct's references for
    forward and backward data; backward filter summed here tap by tap (no shared reference computes it)."""
    import itertools

    from ucudnn.kernels.direct import backward_data_reference, forward_reference

    if op == "forward":
        return forward_reference(a, b, p)
    if op == "backward_data":          # a = w, b = dy
        return backward_data_reference(b, a, p)
    x, dy = a.astype(np.float64), b.astype(np.float64)
    n = x.shape[0]
    xp = np.zeros((n, p.h + 2 * p.pad[0] + p.r, p.w + 2 * p.pad[1] + p.s, p.c))
    xp[:, p.pad[0]:p.pad[0] + p.h, p.pad[1]:p.pad[1] + p.w] = x
    dw = np.zeros((p.k, p.r, p.s, p.c))
    for r, s in itertools.product(range(p.r), range(p.s)):
        win = xp[:, r:r + p.p * p.stride[0]:p.stride[0], s:s + p.q * p.stride[1]:p.stride[1]]
        dw[:, r, s] = np.einsum("npqk,npqc->kc", dy, win)
    return dw


def markdown(prov: dict, doc: dict) -> str:
    cs = doc["computes"]
    lines = [md_header(f"mec under each cuBLAS compute type: {doc['network']} b{doc['batch']} float32 NHWC", prov),
             f"cuBLAS handle math mode: {prov.get('cublas_math_mode')}. us per sample (err: max |got - float64| / "
             "max |float64|, at the smallest size).", "",
             "| kernel | n | variant | workspace MiB | " + " | ".join(f"{c} us/sample" for c in cs) + " | "
             + " | ".join(f"{c} err" for c in cs) + " |",
             "|---|---:|---|---:|" + "---:|" * (2 * len(cs))]
    for r in doc["rows"]:
        lines.append(f"| {r['kernel']} | {r['n']} | {r['variant']} | {r['workspace_bytes'] / 2**20:.2f} | "
                     + " | ".join(str(r.get(f"us_per_sample_{c}")) for c in cs) + " | "
                     + " | ".join(f"{r[f'err_{c}']:.1e}" if f"err_{c}" in r else "-" for c in cs) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
