"""A packed kernel launch (``ucudnn.kernels._compile.packed``): arguments converted once into the parameter block
that cuLaunchKernel reads, only the per-call slots written at each call (CPU: the driver call is recorded and the
block read back through ctypes)."""
from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

from ucudnn.errors import InputError
from ucudnn.kernels import _compile
from ucudnn.kernels._compile import F32, I32, PTR, packed


@pytest.fixture
def driver(monkeypatch):
    """A fake CuPy whose launchKernel records (function, grid, block, shared memory, stream, argument block)."""
    calls = []

    def launch_kernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        calls.append({"f": f, "grid": (gx, gy, gz), "block": (bx, by, bz), "shared": shared, "stream": stream,
                      "params": params, "extra": extra})

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        driver=types.SimpleNamespace(launchKernel=launch_kernel),
        get_current_stream=lambda: types.SimpleNamespace(ptr=4242)))
    monkeypatch.setattr(_compile, "cupy", lambda: fake)
    return calls


def _kernel(ptr=0xABC):
    return types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=ptr))


def _read(params: int, types_: list) -> list:
    """The values behind the argument block's pointers, read as ``types_``."""
    slots = (ctypes.c_void_p * len(types_)).from_address(params)
    return [t.from_address(slots[i]).value for i, t in enumerate(types_)]


def test_fixed_arguments_are_packed_once_and_slots_are_written_at_each_call(driver):
    launch = packed(_kernel(), (7,), (256,), (PTR, np.int32(-3), PTR, np.int64(1 << 40), F32, np.float32(0.5), I32))
    launch(0x1000, 0x2000, 1.25, 9)
    launch(0x3000, 0x4000, -2.0, -18, stream=77)
    layout = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_float,
              ctypes.c_int32]
    first, second = driver
    assert (first["f"], first["grid"], first["block"], first["shared"], first["extra"]) == (0xABC, (7, 1, 1),
                                                                                         (256, 1, 1), 0, 0)
    assert first["stream"] == 4242 and second["stream"] == 77   # CuPy's current stream unless one is named
    assert first["params"] == second["params"]                  # one block, refilled
    assert _read(second["params"], layout) == [0x3000, -3, 0x4000, 1 << 40, -2.0, 0.5, -18]


def test_wrong_arguments_are_refused_naming_the_field(driver):
    with pytest.raises(InputError) as e:
        packed(_kernel(), (1,), (32,), (PTR, 3))   # a Python int: its C type is not known
    assert e.value.field == "args"
    launch = packed(_kernel(), (1,), (32,), (PTR, PTR))
    with pytest.raises(InputError) as e:
        launch(1)
    assert e.value.field == "filled" and driver == []
    with pytest.raises(InputError):
        _compile.Slot("f64")


def test_a_kernel_without_a_function_pointer_launches_through_cupy(monkeypatch, driver):
    seen = []

    class Raw:
        def __call__(self, grid, block, args, shared_mem=0):
            seen.append((grid, block, args, shared_mem))

    launch = packed(Raw(), (2, 3), (64,), (PTR, np.int32(5), F32))
    launch(0x10, 1.5)
    assert seen == [((2, 3, 1), (64, 1, 1), (0x10, np.int32(5), 1.5), 0)] and driver == []
