"""The layering the architecture promises, checked on the source tree.

Layers, bottom up; a module may import its own layer and those below it, never above:

    basics      errors, units, config, problem, numerics, policy, source_names, schemas, data
    planning    ucudnn.planning               pure Python: no GPU, no CuPy, no torch
    binding     ucudnn.binding                ctypes over libcudnn, CuPy plumbing, CUDA-event timing
    kernels     ucudnn.kernels                ucudnn's own CUDA kernels
    measure     ucudnn.measure                benchmarking and algorithm sources
    execute     ucudnn.execute                runs plans
    catalog     ucudnn.catalog                store (and its migrations), bundles, client, lookup chain
    cluster     ucudnn.cluster                precompute, engines
    interfaces  ucudnn (the package), api, cli, torch, server
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from import_graph import cycles, graph, modules

LAYERS = ["basics", "planning", "binding", "kernels", "measure", "execute", "catalog", "cluster", "interfaces"]
#: the longest matching prefix decides a module's layer
PREFIXES = {
    "ucudnn": "interfaces", "ucudnn.__main__": "interfaces", "ucudnn.api": "interfaces", "ucudnn.cli": "interfaces",
    "ucudnn.inference": "interfaces",
    "ucudnn.torch": "interfaces", "ucudnn.server": "interfaces", "ucudnn._moved": "interfaces",
    "ucudnn.errors": "basics", "ucudnn.units": "basics", "ucudnn.config": "basics", "ucudnn.problem": "basics",
    "ucudnn.numerics": "basics", "ucudnn.policy": "basics", "ucudnn.source_names": "basics", "ucudnn.legacy_engines": "basics", "ucudnn.schemas": "basics", "ucudnn.data": "basics",
    "ucudnn.planning": "planning", "ucudnn.binding": "binding", "ucudnn.kernels": "kernels",
    "ucudnn.measure": "measure", "ucudnn.execute": "execute", "ucudnn.catalog": "catalog",
    "ucudnn.server.migrations": "catalog",     # the store's schema history: the store migrates itself on open
    "ucudnn.cluster": "cluster",
}


def layer(module: str) -> str:
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in PREFIXES:
            return PREFIXES[".".join(parts[:i])]
    raise KeyError(module)


def test_every_module_belongs_to_a_layer():
    assert [m for m in modules() if layer(m) not in LAYERS] == []


def test_no_module_imports_one_from_a_layer_above_it():
    upward = sorted(f"{m} ({layer(m)}) imports {d} ({layer(d)})" for m, deps in graph().items() for d in deps
                    if LAYERS.index(layer(d)) > LAYERS.index(layer(m)))
    assert upward == []


def test_there_are_no_import_cycles_in_ucudnn_the_server_or_the_kernels():
    assert cycles(graph()) == []


def test_the_cycle_check_finds_a_cycle_when_there_is_one():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]


PLAN_WITHOUT_GPU = """
import sys
import ucudnn
from ucudnn.planning.table import BenchmarkTable
t = BenchmarkTable.load("builtin:alexnet-b256-float32-NCHW-h100")
wr = ucudnn.plan(t, "wr", workspace_limit="64MiB")
wd = ucudnn.plan(t, "wd", total_workspace="120MiB")
assert wr.total_time_ms > 0 and wd.total_time_ms > 0
gpu = [m for m in sys.modules if m in ("cupy", "torch") or m.startswith(("ucudnn.binding", "ucudnn.measure",
                                                                          "ucudnn.execute", "ucudnn.kernels"))]
print(",".join(gpu))
"""


def test_planning_runs_without_importing_cupy_torch_or_the_gpu_layers():
    out = subprocess.run([sys.executable, "-c", PLAN_WITHOUT_GPU], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"planning imported {out.stdout.strip()}"


def test_the_binding_imports_nothing_but_ctypes_and_ucudnn_errors():
    import ucudnn.binding.cudnn

    src = open(ucudnn.binding.cudnn.__file__).read()
    imports = {line.split()[1] for line in src.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"__future__", "ctypes", "glob", "os", "sys", "threading", "dataclasses", "typing", "..errors"}


@pytest.mark.parametrize("old, new", [
    ("ucudnn.table", "ucudnn.planning.table"), ("ucudnn.sources.graph", "ucudnn.measure.sources.graph"),
    ("ucudnn.engines.base", "ucudnn.cluster.engines.base"), ("ucudnn.store", "ucudnn.catalog.store"),
    ("ucudnn.timing", "ucudnn.binding.timing"), ("ucudnn.network", "ucudnn.planning.network"),
])
def test_an_old_module_path_imports_the_very_module_it_moved_to(old, new):
    code = (f"import importlib, warnings, {new} as n\n"
            f"with warnings.catch_warnings(record=True) as w:\n"
            f"    warnings.simplefilter('always')\n"
            f"    o = importlib.import_module({old!r})\n"
            f"assert o is n and o.__name__ == {new!r} and o.__spec__.name == {new!r}\n"
            f"assert any(issubclass(x.category, DeprecationWarning) and {new!r} in str(x.message) for x in w)\n"
            f"import ucudnn; assert callable(ucudnn.plan)   # the function, not the old ucudnn.plan module\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_documented_public_names_keep_working():
    code = ("import ucudnn, ucudnn.execute, ucudnn.measure\n"
            "from ucudnn.plan import Plan\n"
            "assert callable(ucudnn.plan) and ucudnn.Plan is Plan\n"
            "assert ucudnn.execute.Executor and ucudnn.execute.NetworkExecutor and ucudnn.measure.benchmark\n"
            "assert ucudnn.network.from_torch and ucudnn.ConvProblem and ucudnn.BenchmarkTable\n"
            "assert ucudnn.Conv2d and ucudnn.conv2d_forward and ucudnn.get_plan\n"
            "from ucudnn.planner import plan_wr; from ucudnn.planning.wr import plan_wr as p; assert plan_wr is p\n")
    subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", code], check=True)
