"""The compiled launch path: converted layers' convolutions with no Python between torch and cuDNN.

Why: on small kernels the host's work per launch decides a training step's time.  The Python path
(:mod:`.ops` and :mod:`.runtime`: an autograd Function, the operands' checks, the prepared call's lookup, the
frontend's pybind execute) took a converted ResNet-50 b128 AMP step 107 py-spy samples against PyTorch's 74
(``benchmarks/results/torch_host_spy-*``): 0.48-0.82x PyTorch's images/s on H100 / H200 hosts, on the same
cuDNN engines.  ``csrc/launch.cpp`` does per call what ``nn.Conv2d``'s own C++ path does: one operator
(``torch.ops.ucudnn_c.conv2d``) casts for autocast, records a C++ autograd node, takes outputs and workspace
from torch's caching allocator and calls cuDNN on torch's current stream.

What runs there: plans whose steps all come from the legacy and graph sources or from ucudnn's own kernels that
describe their launches (the depthwise kernels), micro-batched or not
(:class:`~ucudnn.measure.sources.base.Native`: the legacy source's descriptors and algorithm, the graph
source's engine configuration, rebuilt in C++ from its global index and knobs, or the kernels' CUDA functions with
their launch geometry and arguments, launched through the CUDA driver; each step on its micro-batch's shifted
pointers; a graph step that adds into its output through scratch and ``cudnnTransformTensor``, as the graph
source's launcher does).  Every other op (the other own kernels, wrapped sources, installed WD plans,
misaligned micro-batches of graph steps, a launch cuDNN refuses, a workspace torch cannot allocate) comes back
here through ``ucudnn_c::py_launch`` and runs the Python path, fallbacks to torch included: which path ran never
changes a result, only its host time.

Building: the first converted forward starts a background build of ``csrc/launch.cpp`` with
``torch.utils.cpp_extension.load`` (a C++ compiler and ninja needed; no CUDA or cuDNN headers: it uses cuDNN's
C ABI through the library ucudnn's binding loaded); calls run the Python path until it is loaded.  Without a
compiler, or with ``UCUDNN_TORCH_FASTPATH=0``, everything runs the Python path (logged once).
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import torch

from .. import config
from ..errors import summary
from . import ops, runtime

log = logging.getLogger("ucudnn.torch")

SOURCE = Path(__file__).with_name("csrc") / "launch.cpp"
#: the ops' numbers in launch.cpp (operands in cuDNN's order: forward x, w -> y; backward data w, dy -> dx;
#: backward filter x, dy -> dw)
OPS = ("forward", "backward_data", "backward_filter")
_CUDNN_DTYPES = {"float32": 0, "float16": 2, "bfloat16": 9}     # cudnnDataType_t

_lock = threading.Lock()
_state = "new"                  # "new" -> "building" -> "ready" | "off"
_lib: Any = None                # the torch.library registration of py_launch (kept alive)
_thread: threading.Thread | None = None
#: Python's side of each compiled layer: its ops.Layer and numerics (py_launch runs those)
_py_layers: list[tuple[ops.Layer, str]] = []
#: what the compiled launches refer to (the legacy source's descriptors): kept for the process, as the
#: launches are (an autograd node may run one long after its layer's entry was replaced)
_keep: list[Any] = []
#: id(prepared call) -> (the call, its program id or -1): entries remade after a plan change elsewhere (every
#: entry of every layer is, at each ``api.generation``) reuse the programs of calls that did not change, so
#: heuristic mode's background benchmarks, which replace plans one kernel at a time, rebuild only what changed
_programs: dict[int, tuple[Any, int]] = {}


def disabled_by_environment() -> bool:
    return os.environ.get("UCUDNN_TORCH_FASTPATH", "1").strip().lower() in ("0", "false", "off", "no")


def ready() -> bool:
    """Whether the compiled path is loaded (starts its build in the background the first time; False until then)."""
    if _state == "ready":
        return True
    if _state == "new":
        start()
    return False


def start(wait: bool = False) -> bool:
    """Build and load the compiled path (in a background thread; ``wait``: until it is done); True once loaded.

    A benchmark or a job that wants every call on the compiled path from its first step calls
    ``start(wait=True)`` first (the build takes tens of seconds once; later processes load the cached build)."""
    global _state, _thread
    with _lock:
        if _state == "new":
            if disabled_by_environment():
                _state = "off"
            else:
                _state = "building"
                _thread = threading.Thread(target=_build, name="ucudnn-fastpath-build", daemon=True)
                _thread.start()
    if wait and _thread is not None:
        _thread.join()
    return _state == "ready"


def state() -> str:
    """"ready" (loaded), "building", "off" (disabled or unavailable: the Python path runs) or "new" (not asked yet)."""
    return _state


def _build() -> None:
    global _state, _lib, _api, _c, _conv2d
    try:
        from torch.utils import cpp_extension

        from ..binding import cudnn

        cudnn.load()
        cpp_extension.load(name="ucudnn_torch_launch", sources=[str(SOURCE)], extra_cflags=["-O2"],
                           extra_ldflags=["-ldl"], is_python_module=False, verbose=False)
        c = torch.ops.ucudnn_c
        c.init(cudnn.library_path())
        lib = torch.library.Library("ucudnn_c", "IMPL")
        lib.impl("py_launch", _py_launch, "CUDA")
        from .. import api

        _lib, _api, _c, _conv2d = lib, api, c, c.conv2d.default._op
        _state = "ready"
    except Exception as e:  # noqa: BLE001 - any failure leaves the Python path, which always works
        _state = "off"
        log.warning("ucudnn: the compiled launch path is not available, converted layers run the Python path: %s",
                    summary(e))


# --- per call ------------------------------------------------------------------------------------------------
def forward(m: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor | None:
    """``m``'s convolution of ``x`` (bias included) through the compiled path, or None: the caller runs the Python
    path (a call the compiled path does not take: another dtype, a module the Python path refuses, a build not
    ready).  The entry a call finds is keyed by everything that picks its plan (shapes, strides, dtypes, torch's
    numerics switches, whether gradients are wanted, the layer's environment defaults) and holds the lookup
    chain's generation it was made at (``ucudnn.api.generation``): a replaced plan makes a new entry.

    ``w`` / ``b``: ``m.weight`` / ``m.bias`` (the caller reads them through :func:`params`)."""
    if torch.is_autocast_enabled("cuda"):
        cast = torch.get_autocast_dtype("cuda")
        dt = cast
    else:
        cast, dt = None, x.dtype
    grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
    # torch's numerics and cuDNN switches read raw (runtime.numerics_for derives the numerics from them when an entry
    # is made)
    key = (_FAST, x.shape, x.stride(), x.dtype, w.stride(), w.dtype, dt, _allow_tf32(), _deterministic(),
           _deterministic_algorithms(), _cudnn_enabled(), grad, runtime._defaults_env(m))
    hit = m._ucudnn_layers.get(key)
    if hit is None or hit[0] != _api.generation:
        hit = _entry(m, x, w, dt, key, grad)
    elif runtime._release_pending:
        runtime.release_cached()
    if hit[1] is None:
        return None
    return _conv2d(x, w, b, hit[1], cast)


def params(m: Any, cls: type) -> tuple[Any, Any]:
    """(``m.weight``, ``m.bias``) of a module whose class is exactly ``cls``, read from its parameter dict where
    they are registered there (``nn.Module.__getattr__``, which ``m.weight`` goes through, took 1.7 us a read on
    CI's host: two reads are most of the module's own Python per call); anything else (a parametrization's class,
    an old-style ``weight_norm`` that keeps ``weight`` outside the dict) through the attributes."""
    if type(m) is cls:
        p = m._parameters
        w = p.get("weight")
        if w is not None and "bias" in p:
            return w, p["bias"]
    return m.weight, m.bias


class _Fast:
    """The key prefix of compiled entries in a module's layer dict (never equal to a Python-path key)."""


_FAST = _Fast()
_allow_tf32 = torch._C._get_cudnn_allow_tf32
_deterministic = torch._C._get_cudnn_deterministic
_deterministic_algorithms = torch._C._get_deterministic_algorithms
#: part of the key: ``torch.backends.cudnn.enabled = False`` after a layer's first call sends its next calls to torch
#: (the Python path's ``Conv2d._unsupported``), as it would a plain ``nn.Conv2d``'s
_cudnn_enabled = torch._C._get_cudnn_enabled
_api: Any = None        # ucudnn.api, once the build is loaded (its generation is read per call)
_c: Any = None          # torch.ops.ucudnn_c, once loaded (the registration ops)
_conv2d: Any = None     # torch.ops.ucudnn_c.conv2d's overload, called without the op packet's Python frames


def _entry(m: Any, x: torch.Tensor, w: torch.Tensor, dt: torch.dtype, key: tuple, grad: bool
           ) -> tuple[int, int | None]:
    """Make and keep (generation, compiled layer id) for this call's key; the id None where the Python path
    takes every call of it (another dtype, a module the Python path refuses), so such calls are not examined
    again until a plan changes."""
    generation = _api.generation
    layers = m._ucudnn_layers
    hit: tuple[int, int | None] = ops.remember(layers, key, (generation, None))
    if x.dtype not in runtime.DTYPES or w.dtype not in runtime.DTYPES:
        return hit      # autocast leaves float64 alone where the Python path casts it: that path takes them
    reason, xc, wc, _ = m._operands(x)
    if reason is not None or xc.dtype != dt:
        return hit
    layout = runtime.layout_of(xc, wc)
    layer = ops._layer(xc, wc, m.stride, m._padding(), m.dilation, m.groups, layout, m.workspace_limit,
                       m.batch_policy, m.sources, m.replay)
    numerics = runtime.numerics_for(dt)
    device = xc.get_device()
    try:
        ids = [-1, -1, -1]
        for i, op in enumerate(OPS if grad else OPS[:1]):
            ids[i] = _launch_id(op, layer, numerics, device)
        if grad and config.unwritten():
            # the backward filter's plan that may take workspace from the layer's dx, run first in the backward
            # when both gradients are wanted (launch.cpp's Conv::backward), as EagerConv2d.backward does
            ids.append(_launch_id("backward_filter", layer, numerics, device, borrowing=True))
        with _lock:
            _py_layers.append((layer, numerics))
            py_id = len(_py_layers) - 1
        cid = int(_c.add_layer(ids, list(layer.y_shape), layout == "NHWC", py_id))
        hit = ops.remember(layers, key, (generation, cid))
    except Exception as e:  # noqa: BLE001 - the Python path takes the call and meets (and reports) what failed here
        runtime.log_once(("fastpath", layer.problem), f"{layer.problem.describe()} runs the Python path: {summary(e)}")
    return hit


def _launch_id(op: str, layer: ops.Layer, numerics: str, device: int, borrowing: bool = False) -> int:
    """The compiled program of ``op`` for this layer, or -1 (Python's): the plan prepared through the lookup chain
    as the Python path prepares it (so both run the same plan), then :func:`register`.  A plan that cannot be made
    here (no plan fits, a benchmark failure) is -1 too: the Python path meets the same failure and says why, once.
    ``borrowing`` (backward filter): the plan whose launches bring the layer's dx (``layer.dw_settings``), -1
    where it takes none of that memory (the plain plan then runs)."""
    if not runtime._shared:
        runtime.share_torch_memory()
    cp = runtime._cp
    try:
        with cp.cuda.Device(device), runtime.cupy_stream(device):
            call = runtime.prepared(op, layer.problem, layer.dw_settings if borrowing else layer.settings, numerics,
                                    device)
    except runtime.FALLBACK_ERRORS:
        return -1
    if borrowing and not getattr(call.executor, "takes_unwritten", False):
        return -1
    return register(op, call, layer.problem, device)


def register(op: str, call: Any, problem: Any, device: int) -> int:
    """The compiled program made from a prepared call (:class:`ucudnn.torch.runtime._Call`) of ``op``, or -1.

    Each step of the call's plan (the executor's ``native_steps``: its source's
    :class:`~ucudnn.measure.sources.base.Native` description, the byte shifts of its micro-batch / channel slice,
    whether it accumulates, where its workspace is: the call's buffer or the output's unwritten tail) becomes a
    launch in the C++ registry (legacy: the source's descriptors and
    algorithm; graph: the engine configuration with the operands' dims and strides in ``op``'s roles), and the
    steps one program with the workspace the call takes from torch's allocator.  -1 for what the compiled path does
    not run: a step with no description (ucudnn's own kernels, wrapped sources, a graph engine that would
    accumulate), an installed plan (its workspace is an arena segment), or a configuration cuDNN refuses to
    rebuild (said once)."""
    hit = _programs.get(id(call))
    if hit is not None and hit[0] is call:
        return hit[1]       # the same prepared call: its program (or refusal) again, nothing rebuilt
    pid = _register(op, call, problem, device)
    _programs[id(call)] = (call, pid)
    return pid


def _register(op: str, call: Any, problem: Any, device: int) -> int:
    steps = getattr(call.executor, "native_steps", None)
    if not steps or call.installed is not None:
        return -1
    number = OPS.index(op)
    workspace = int(call.ws_bytes)
    ids: list[int] = []
    shifts: list[int] = []
    try:
        for s in steps:
            # a step on the output's unwritten tail gets what it needs there, the others the call's buffer
            ids.append(_launch(number, op, s.native, s.need if s.from_out >= 0 else workspace, device,
                               s.accumulate))
            shifts += [int(v) for v in s.shifts]
        pid = int(_c.add_program(ids, shifts, [int(s.accumulate) for s in steps], workspace,
                                 [int(s.from_out) for s in steps]))
    except (RuntimeError, ValueError) as e:
        kinds = ",".join(sorted({s.native.kind for s in steps}))
        runtime.log_once(("fastpath", problem, op, kinds),
                         f"{op} {problem.describe()} runs the Python path: {summary(e)}")
        return -1
    _keep.append(([s.native.keep for s in steps], call))
    return pid


def _launch(number: int, op: str, native: Any, workspace: int, device: int, accumulate: bool = False) -> int:
    """One step's launch in the C++ registry (raises RuntimeError where the extension refuses it); ``accumulate``:
    the step adds into what earlier steps wrote.  A legacy step with a graph-API twin (``native.twin``) that does
    not accumulate launches the twin: the same engine, without the legacy call's per-call finalization."""
    if native.kind == "legacy" and native.twin is not None and not accumulate:
        try:
            return _launch(number, op, native.twin, workspace, device)
        except (RuntimeError, ValueError):
            pass        # the extension refused the twin: the legacy call, as without one
    if native.kind == "legacy":
        a, b, out, conv = native.descriptors
        return int(_c.legacy_launch(number, int(a), int(b), int(out), int(conv), int(native.algo), workspace))
    if native.kind == "kernel":
        return _kernel_launch(number, native, workspace, device)
    if native.kind != "graph":
        raise ValueError(f"no compiled launch for {native.kind!r} configurations")
    from ..measure.sources.graph import blend_of, tensor_layout
    from ..problem import ROLES

    p = native.problem
    lay = tensor_layout(p)
    (ad, as_), (bd, bs), (od, os_) = (lay[r] for r in ROLES[op])
    knobs = list(native.knobs)
    # a step that accumulates gets the graph source's blend: the engine (built with beta 0) writes into scratch
    # after its own workspace, and cudnnTransformTensor adds that into the output
    blend = (blend_of(op, p, int(native.engine_bytes)) if accumulate else None) or (0, 0, 0)
    return int(_c.backend_launch(number, _CUDNN_DTYPES[p.dtype], ad, as_, bd, bs, od, os_, list(p.pad),
                                 list(p.stride), list(p.dilation), int(native.engine_id), [k for k, _ in knobs],
                                 [v for _, v in knobs], max(workspace, int(native.engine_bytes)), device, *blend))


#: a kernel call's per-launch arguments and their numbers in launch.cpp (then int32, int64 and float32 values)
_ARG_KINDS = {"a": 0, "b": 1, "out": 2, "alpha": 3, "beta": 4, "ws": 8}
_VALUE_KINDS = {"int32": 5, "int64": 6, "float32": 7}
_ALIGNED_BITS = {"a": 1, "b": 2, "out": 4}


def _kernel_launch(number: int, native: Any, workspace: int, device: int) -> int:
    """ucudnn's own kernels (``native.calls``, ``kernels._compile.Call``) as one launch in the C++ registry: each
    call's CUDA functions (scalar, and vector where it has one: 0 otherwise), the operands its vector kernel needs
    16-byte aligned, grid, block, shared memory and arguments, flattened."""
    import contextlib

    import numpy as np

    fns, aligned, dims, nargs, kinds, ints, floats = [], [], [], [], [], [], []
    # the functions are loaded on the layer's device (CuPy loads a RawKernel's module where it is first asked for)
    with runtime._cp.cuda.Device(device) if runtime._cp is not None else contextlib.nullcontext():
        for c in native.calls:
            fns += [int(c.scalar.kernel.ptr), int(c.vector.kernel.ptr) if c.vector is not None else 0]
            aligned.append(sum(_ALIGNED_BITS[r] for r in c.aligned))
            dims += [*map(int, c.grid), *map(int, c.block), int(c.smem)]
            nargs.append(len(c.args))
            for x in c.args:
                if isinstance(x, str):
                    kinds.append(_ARG_KINDS[x])
                    ints.append(0)
                    floats.append(0.0)
                else:
                    kind = _VALUE_KINDS[np.asarray(x).dtype.name]
                    kinds.append(kind)
                    ints.append(int(x) if kind != 7 else 0)
                    floats.append(float(x) if kind == 7 else 0.0)
    return int(_c.kernel_launch(number, workspace, fns, aligned, dims, nargs, kinds, ints, floats))


def _py_launch(op: int, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, py_layer: int) -> None:
    """``ucudnn_c::py_launch``: op ``op`` of compiled layer ``py_layer`` by the Python path, into ``out``."""
    layer, numerics = _py_layers[py_layer]
    name = OPS[op]
    if ops._run(name, layer, a, b, out, numerics):
        return
    out.copy_(ops.torch_result(name, layer, a, b, out))
