"""Print what the GPU machine has and what cuDNN's Find returns for one layer (debug aid, no timings claimed)."""
from __future__ import annotations

import json
import sys

import cupy as cp

from ucudnn.binding import cudnn
from ucudnn.binding.gpu import descriptors, device_name, handle
from ucudnn.measure.benchmarking import Buffers
from ucudnn.problem import ConvProblem


def main() -> None:
    cudnn.load()
    info = {"device": device_name(), "cudnn_library": cudnn.library_path(), "cudnn_version": cudnn.get_version(),
            "cupy": cp.__version__, "python": sys.version.split()[0]}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cudnn"] = torch.backends.cudnn.version()
    except Exception as e:  # noqa: BLE001
        info["torch"] = f"unavailable: {e}"
    print(json.dumps(info, indent=1))
    for dtype, layout in (("float16", "NHWC"),):
        p = ConvProblem(256, 96, 27, 27, 256, 5, 5, pad=(2, 2), dtype=dtype, layout=layout)
        buf = Buffers(p)
        ws = cp.cuda.alloc(4 << 30)
        for op in ("forward", "backward_data", "backward_filter"):
            for math in ("DEFAULT", "TENSOR_OP", "TENSOR_OP_ALLOW_CONVERSION", "FMA"):
                d = descriptors(p, math)
                a, b, out = d.operands(op)
                o = buf.operands(op, 256)
                h = handle()
                res = cudnn.find_algorithm_ex(h, op, a, o.a, b, o.b, d.conv, out, o.out,
                                              2 * cudnn.get_algorithm_max_count(h, op), ws.ptr, 4 << 30)
                print(f"{dtype} {layout} {op} desc={math}: " + "; ".join(
                    f"{r.algo}/{r.math_type}/{r.status_name.removeprefix('CUDNN_STATUS_')}/{r.time_ms:.3f}ms/{r.workspace_bytes >> 20}MiB"
                    for r in res))


if __name__ == "__main__":
    main()
