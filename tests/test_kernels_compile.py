"""Every CUDA source under kernels/ compiles with nvcc for sm_80 and sm_90 (no GPU needed).

The sources are templates, so each file carries a few representative
instantiations under ``UCUDNN_NVCC_CHECK``; compiling with that macro makes
nvcc generate (and ptxas allocate registers for) real code.  The forward
kernels -- the ones held to bandwidth bars -- must keep their data in
registers: no stack frame, no spills.  At run time the same text is compiled
by NVRTC (``ucudnn.kernels._compile``), which gets no include path, so the
inlined source must be self-contained.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from importlib import resources

import pytest
from ucudnn.kernels import _compile

NVCC = shutil.which("nvcc")
SOURCES = _compile.source_names()
HOT = re.compile(r"layout_transpose|layout_rows_aligned|layout_rows_shifted|softmax_rows|softmax_inner|pool_nchw_fwd|"
                 r"pool_chwn_fwd")


def test_every_launcher_source_is_shipped():
    assert SOURCES == ["direct.cu", "fft.cu", "fold.cu", "fused.cu", "igemm.cu", "layout.cu", "mec.cu", "pointwise.cu",
                       "pooling.cu", "softmax.cu", "spatial.cu", "winograd.cu"]


@pytest.mark.parametrize("name", SOURCES)
def test_run_time_source_is_self_contained(name):
    text = _compile.source(name)
    assert '#include "' not in text and "#include <" not in text
    assert text.count("struct __align__(2) half_t") == 1  # common.cuh inlined exactly once


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", SOURCES)
def test_source_compiles_with_nvcc_without_spilling_hot_kernels(name, arch, tmp_path):
    src = resources.files("ucudnn.kernels").joinpath(name)
    with resources.as_file(src) as path:
        proc = subprocess.run([NVCC, "-std=c++17", f"-arch={arch}", "--cubin", "-DUCUDNN_NVCC_CHECK", "-Xptxas", "-v",
                               "-o", str(tmp_path / "k.cubin"), str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = proc.stderr
    archs = re.findall(r"Compiling entry function '\w+' for '(\w+)'", report)
    kernels = re.findall(r"Function properties for (\w+)\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                         r"(\d+) bytes spill loads", report)
    assert kernels and len(archs) == len(kernels), report
    assert set(archs) == {arch}
    for fn, stack, stores, loads in kernels:
        if HOT.search(fn):
            assert (stack, stores, loads) == ("0", "0", "0"), f"{fn} uses local memory on {arch}"
