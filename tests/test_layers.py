"""The layering the architecture promises, checked: planning never imports CuPy or the GPU layers."""
from __future__ import annotations

import subprocess
import sys

PLAN_WITHOUT_GPU = """
import sys
import ucudnn
from ucudnn.table import BenchmarkTable
t = BenchmarkTable.load("builtin:alexnet-b256-float32-NCHW-h100")
wr = ucudnn.plan(t, "wr", workspace_limit="64MiB")
wd = ucudnn.plan(t, "wd", total_workspace="120MiB")
assert wr.total_time_ms > 0 and wd.total_time_ms > 0
gpu = [m for m in ("cupy", "ucudnn.gpu", "ucudnn.cudnn", "ucudnn.measure", "ucudnn.execute") if m in sys.modules]
print(",".join(gpu))
"""


def test_planning_runs_without_importing_cupy_or_the_gpu_layers():
    out = subprocess.run([sys.executable, "-c", PLAN_WITHOUT_GPU], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"planning imported {out.stdout.strip()}"


def test_the_binding_imports_nothing_but_ctypes_and_ucudnn_errors():
    import ucudnn.cudnn

    src = open(ucudnn.cudnn.__file__).read()
    imports = {line.split()[1] for line in src.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"__future__", "ctypes", "glob", "os", "sys", "threading", "dataclasses", "typing", ".errors"}
