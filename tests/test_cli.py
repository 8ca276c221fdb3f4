"""The ``ucudnn`` command as users' scripts call it (no GPU needed for planning)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ucudnn.cli import main
from ucudnn.planning.table import BenchmarkTable


@pytest.fixture
def table_file(tmp_path):
    path = tmp_path / "T.json"
    BenchmarkTable.load("builtin:alexnet-b256-float32-NCHW-h100").save(path)
    return path


def run_json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_the_documented_plan_command_prints_json_with_total_and_per_kernel_configs(table_file, capsys):
    doc = run_json(capsys, "plan", "--from-table", str(table_file), "--workspace-limit", "64MiB",
                   "--batch-policy", "powerOfTwo", "--json")
    assert doc["total_time_ms"] == pytest.approx(sum(k["time_ms"] for k in doc["kernels"]))
    assert len(doc["kernels"]) == 15
    for k in doc["kernels"]:
        assert sum(m["micro_batch"] for m in k["micro_batches"]) == 256
        assert {"algo", "math_type", "time_ms", "workspace_bytes"} <= set(k["micro_batches"][0])
        assert k["workspace_bytes"] <= 64 << 20


def test_the_console_script_runs_as_a_separate_process(table_file):
    out = subprocess.run([sys.executable, "-m", "ucudnn", "plan", "--from-table", str(table_file),
                          "--workspace-limit", "64MiB", "--batch-policy", "powerOfTwo", "--json"],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["policy"] == "wr"


@pytest.mark.parametrize("size", ["67108864", "64MiB", "64MB", "65536KiB"])
def test_sizes_in_any_unit(table_file, capsys, size):
    doc = run_json(capsys, "plan", "--from-table", str(table_file), "--workspace-limit", size, "--json")
    assert doc["workspace_limit"] in (64 << 20, 64_000_000)


def test_no_table_plans_the_shipped_real_table(capsys):
    doc = run_json(capsys, "plan", "--json")
    assert doc["device"].startswith("NVIDIA H100")


def test_plans_on_unwritten_memory_are_asked_for_with_a_flag_and_say_so(table_file, capsys):
    """``--unwritten``: WR where a step may take its workspace from output not written yet (``workspace_from:
    unwritten`` in the JSON, ``(unwritten)`` in the table); never slower than without; with ``wd``, exit 2."""
    plain = run_json(capsys, "plan", "--from-table", str(table_file), "--workspace-limit", "8MiB", "--json")
    doc = run_json(capsys, "plan", "--from-table", str(table_file), "--workspace-limit", "8MiB", "--unwritten",
                   "--json")
    marked = [m for k in doc["kernels"] for m in k["micro_batches"] if m.get("workspace_from") == "unwritten"]
    assert marked and doc["total_time_ms"] < plain["total_time_ms"]
    assert all(k["workspace_bytes"] <= 8 << 20 for k in doc["kernels"])
    assert main(["plan", "--from-table", str(table_file), "--workspace-limit", "8MiB", "--unwritten"]) == 0
    assert "(unwritten)" in capsys.readouterr().out
    assert main(["plan", "--from-table", str(table_file), "--policy", "wd", "--total-workspace", "64MiB",
                 "--unwritten"]) == 2
    assert "unwritten" in capsys.readouterr().err


def test_plan_takes_host_near_ties_unless_UCUDNN_HOST_TIES_is_0(tmp_path, capsys, monkeypatch):
    """A table recording host work (``host_ms``): ``ucudnn plan`` takes a near-tie that costs the host less, as the
    library's plans do; ``UCUDNN_HOST_TIES=0`` the fastest."""
    from ucudnn.planning.table import KernelBench, Measurement
    from ucudnn.problem import ConvProblem

    rows = [Measurement(16, 1, "FMA", 1.0, 0, extra={"host_ms": 0.110}),
            Measurement(16, 0, "FMA", 1.002, 0, extra={"host_ms": 0.025})]
    path = tmp_path / "tied.json"
    BenchmarkTable("NVIDIA H200", 91900, [KernelBench("conv/forward", "forward",
                                                      ConvProblem(16, 64, 28, 28, 64, 3, 3, (1, 1)), rows)],
                   "strict").save(path)
    algos = lambda doc: [m["algo"] for k in doc["kernels"] for m in k["micro_batches"]]  # noqa: E731
    assert algos(run_json(capsys, "plan", "--from-table", str(path), "--workspace-limit", "8MiB", "--json")) == [0]
    monkeypatch.setenv("UCUDNN_HOST_TIES", "0")
    assert algos(run_json(capsys, "plan", "--from-table", str(path), "--workspace-limit", "8MiB", "--json")) == [1]


def test_human_output_is_a_table(table_file, capsys):
    assert main(["plan", "--from-table", str(table_file)]) == 0
    out = capsys.readouterr().out
    assert "conv2/forward" in out and "total" in out


def test_environment_defaults_are_honoured(table_file, capsys, monkeypatch):
    monkeypatch.setenv("UCUDNN_DEFAULT_WORKSPACE_LIMIT", "8MiB")
    monkeypatch.setenv("UCUDNN_BATCH_SIZE_POLICY", "undivided")
    doc = run_json(capsys, "plan", "--from-table", str(table_file), "--json")
    assert doc["workspace_limit"] == 8 << 20 and doc["batch_policy"] == "undivided"
    monkeypatch.setenv("UCUDNN_TOTAL_WORKSPACE_SIZE", str(120 << 20))
    doc = run_json(capsys, "plan", "--from-table", str(table_file), "--json")
    assert doc["policy"] == "wd" and doc["total_workspace"] == 120 << 20


def test_an_infeasible_limit_exits_3_naming_the_smallest_limit(tmp_path, capsys):
    doc = json.loads(BenchmarkTable.load("builtin:alexnet-b256-float32-NCHW-h100").to_json())
    for k in doc["kernels"]:  # keep only the workspace-hungry configurations
        k["measurements"] = [m for m in k["measurements"] if m["workspace_bytes"] > 0] or k["measurements"]
    path = tmp_path / "hungry.json"
    path.write_text(json.dumps(doc))
    assert main(["plan", "--from-table", str(path), "--workspace-limit", "0", "--batch-policy", "powerOfTwo"]) == 3
    assert "smallest per-kernel limit that works" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["plan", "--workspace-limit", "lots"], "workspace_limit"),
    (["plan", "--workspace-limit=-1MiB"], "negative"),
    (["plan", "--batch-policy", "half"], "batch-size policy"),
    (["plan", "--from-table", "/nonexistent/T.json"], "cannot read"),
])
def test_bad_input_exits_2_with_a_clear_message(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_bench_without_a_gpu_exits_4_and_says_why(tmp_path, capsys):
    from ucudnn.binding.gpu import gpu_available

    if gpu_available():
        pytest.skip("this machine has a GPU")
    assert main(["bench", "--problem", "n=8,c=3,h=8,k=4,r=3", "-o", str(tmp_path / "t.json")]) == 4
    assert "CuPy" in capsys.readouterr().err or "CUDA" in capsys.readouterr().err
