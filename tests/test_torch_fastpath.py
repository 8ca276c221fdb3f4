"""ucudnn.torch's compiled launch path without a GPU: its C++ source compiles against the installed torch's
headers (no CUDA or cuDNN headers needed), it can be switched off, and CPU calls never reach it."""
from __future__ import annotations

import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")

from ucudnn.torch import fastpath  # noqa: E402


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler")
def test_the_launch_path_compiles_against_torchs_headers_alone():
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    r = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-w", abi, *includes, str(fastpath.SOURCE)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def test_the_environment_switches_it_off(monkeypatch):
    monkeypatch.setattr(fastpath, "_state", "new")
    monkeypatch.setattr(fastpath, "_thread", None)
    monkeypatch.setenv("UCUDNN_TORCH_FASTPATH", "0")
    assert fastpath.start(wait=True) is False
    assert fastpath.state() == "off" and not fastpath.ready()


@pytest.mark.parametrize("value", ["1", "", "yes"])
def test_other_values_leave_it_on(monkeypatch, value):
    monkeypatch.setenv("UCUDNN_TORCH_FASTPATH", value)
    assert not fastpath.disabled_by_environment()


def test_cpu_calls_run_torch_without_asking_for_the_build(monkeypatch):
    import ucudnn.torch as ut

    asked = []
    monkeypatch.setattr(fastpath, "ready", lambda: asked.append(1) or False)
    conv = torch.nn.Conv2d(3, 4, 3)
    ours = ut.convert(torch.nn.Conv2d(3, 4, 3))
    ours.load_state_dict(conv.state_dict())
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(ours(x), conv(x))
    assert asked == []
