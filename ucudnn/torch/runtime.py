"""Running ucudnn plans on torch tensors: their own memory, torch's current stream, torch's allocator.

The bridge between the torch layer and the layers below: a convolution's
:class:`~ucudnn.problem.ConvProblem` from tensors and torch's flags, the
:class:`~ucudnn.execute.Executor` for it (the lookup chain of
:mod:`ucudnn.api`: in-process, user cache, plan server, bundles, else
benchmark), and one launch on raw ``data_ptr()`` pointers.

Why no copies and no second pool: ucudnn exists for memory pressure, so the
workspace is a ``torch.empty`` of the plan's size from PyTorch's caching
allocator (``torch.cuda.max_memory_allocated()`` counts it, the cap of
``set_per_process_memory_fraction`` applies to it, and it is reused like any
activation), and CuPy's own allocations (benchmark buffers) go through the
same allocator (:func:`share_torch_memory`, what pytorch-pfn-extras'
``use_torch_mempool_in_cupy`` does).

Why a prepared call per kernel (:class:`_Call`): a training step launches
every convolution three times, and on small kernels (ResNet-50 under AMP: many
take 20-60 us of GPU time) the host's work per launch can decide the step
time.  Measured on an H100 (``benchmarks/torch_profile.py``, ResNet-50 b128
AMP channels_last, 256 MiB per kernel): some runs host-bound at 42-55 ms per
step where PyTorch's is GPU-bound at 28 ms, with the ucudnn path paying, on
every launch, the lookup chain's front (limit parsing, policy and numerics
normalisation, environment reads, hashing the problem three times) and CuPy
imports.  Everything derived from (op, problem, settings, numerics, device)
is now resolved once and kept; a launch is one dict lookup, an identity check
that the executor is still the one the lookup chain holds (heuristic mode
replaces executors, and ``ucudnn.torch.plan`` installs plans), the workspace
from torch's allocator and the executor's launches.  One-step plans (most,
above a few MiB of workspace) skip the executor and CuPy's contexts: their
source's shortcut (``sources.base.Direct``) runs on torch's raw stream; on
one H100 that took a ResNet-50 b128 AMP step from a median 41.6 to 36.9 ms
(``benchmarks/results/torch_host_ab.md``).
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass, replace
from typing import Any

import torch

from .. import config
from .. import numerics as num
from ..binding.gpu import set_free_memory
from ..errors import CudnnError, CudnnNotFound, GpuUnavailable, InfeasibleError, UcudnnError
from ..problem import ConvProblem

log = logging.getLogger("ucudnn.torch")

#: torch dtype -> ucudnn dtype; anything else runs through torch unchanged
DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}

_lock = threading.Lock()
_shared = False
_cp: Any = None                     # CuPy, once :func:`share_torch_memory` has run (the launch path needs it)
_api: Any = None                    # ucudnn.api, imported at the first launch (the core's heavy imports)
_streams: dict[tuple[int, int], Any] = {}
_logged: set[tuple] = set()
#: set by :func:`ucudnn.torch.plan` while it traces a model: converted layers record their calls and run torch's
recording: list | None = None


@dataclass(frozen=True)
class Settings:
    """What a converted layer asks of ucudnn: the same fields travel as the custom op's arguments."""

    workspace_limit: int
    batch_policy: str = ""       # "" : UCUDNN_BATCH_SIZE_POLICY or powerOfTwo
    sources: str = ""            # "" : the default sources
    replay: bool = False
    #: a backward filter's launches pass its layer's dx before backward data writes it (``launch(unwritten=)``):
    #: its plan may take workspace there (``UCUDNN_UNWRITTEN``).  Not a custom-op argument: the eager backward
    #: (``ucudnn.torch.ops.EagerConv2d.backward``) and the compiled path's C++ node run dw before dx; the custom
    #: op's separate gradient ops do not
    dx_unwritten: bool = False


@dataclass
class Installed:
    """A plan put in place by :func:`ucudnn.torch.plan`: its executor and, for WD, its segment of one arena."""

    executor: Any
    workspace_ptr: int | None = None    # None: a workspace from torch's allocator per call
    workspace_size: int = 0
    owner: Any = None                   # keeps the arena alive (a NetworkExecutor)


#: (device index, problem, op) -> an installed plan, preferred over per-kernel lookups
installed: dict[tuple[int, ConvProblem, str], Installed] = {}


def numerics_for(dtype: torch.dtype) -> str:
    """ucudnn's numerics from torch's own switches, so a converted model computes what the original would.

    float32: ``torch.backends.cudnn.allow_tf32`` picks ``tf32`` or ``strict``; half types: ucudnn's default
    for them (float32 accumulation).  ``torch.use_deterministic_algorithms(True)`` or
    ``torch.backends.cudnn.deterministic`` add ``-deterministic``.
    """
    base = ("tf32" if torch.backends.cudnn.allow_tf32 else "strict") if dtype == torch.float32 else \
        _HALF_NUMERICS.get(dtype) or num.normalize(None, DTYPES[dtype])
    if torch.are_deterministic_algorithms_enabled() or torch.backends.cudnn.deterministic:
        return f"{base}-deterministic"
    return base


#: the numerics of the half types (``num.normalize(None, dtype)``: a constant per dtype, looked up per call)
_HALF_NUMERICS = {t: num.normalize(None, name) for t, name in DTYPES.items() if t != torch.float32}


#: layout -> torch memory format (a dict: the ops look theirs up on every call)
MEMORY_FORMATS = {"NHWC": torch.channels_last, "NCHW": torch.contiguous_format}


def memory_format(layout: str) -> torch.memory_format:
    return MEMORY_FORMATS.get(layout, torch.contiguous_format)


def _channels_last(t: torch.Tensor) -> bool:
    """Whether ``t``'s strides are channels_last (for C = 1 or 1x1 maps both layouts hold: the C stride decides)."""
    if t.dim() != 4 or not t.is_contiguous(memory_format=torch.channels_last):
        return False
    return not t.is_contiguous() or (t.stride(1) == 1 and t.shape[2] * t.shape[3] > 1)


def runs_here(t: torch.Tensor) -> bool:
    """Whether ucudnn runs convolutions on ``t``'s device (CUDA); tensors elsewhere go to torch unchanged."""
    return t.is_cuda


def layout_of(x: torch.Tensor, weight: torch.Tensor | None = None) -> str:
    """NHWC when the input or the weight is channels_last, NCHW otherwise: PyTorch's own rule for cuDNN
    (``cudnn_conv_suggest_memory_format``), so outputs come back in the memory format nn.Conv2d gives."""
    return "NHWC" if _channels_last(x) or (weight is not None and _channels_last(weight)) else "NCHW"


def problem_of(x_shape: Any, w_shape: Any, stride: Any, padding: Any, dilation: Any, groups: int, dtype: torch.dtype,
               layout: str) -> ConvProblem:
    """The problem of a convolution given in PyTorch's logical NCHW / KCRS shapes (whatever the memory format).

    Cached: a training step asks for the same few problems hundreds of times, and building (validating)
    a ConvProblem costs tens of microseconds of host time.
    """
    key = (tuple(x_shape), tuple(w_shape), tuple(stride), tuple(padding), tuple(dilation), int(groups), dtype, layout)
    return _problem_cached(*key)


@functools.lru_cache(maxsize=4096)
def _problem_cached(x_shape: tuple, w_shape: tuple, stride: tuple, padding: tuple, dilation: tuple, groups: int,
                    dtype: torch.dtype, layout: str) -> ConvProblem:
    n, c, h, w = (int(v) for v in x_shape)
    k, _, r, s = (int(v) for v in w_shape)
    return ConvProblem(n, c, h, w, k, r, s, tuple(padding), tuple(stride), tuple(dilation), int(groups),
                       DTYPES[dtype], layout)


def share_torch_memory() -> None:
    """Route CuPy's allocations through PyTorch's caching allocator (once per process).

    Benchmark buffers and any CuPy-side allocation then count in torch's
    statistics and obey its memory cap, and freed blocks go back to one pool.
    """
    global _shared
    if _shared:
        return
    with _lock:
        if _shared:
            return
        from ..binding.gpu import cupy

        cp = cupy()

        def malloc(size: int, device: int) -> int:
            return torch.cuda.caching_allocator_alloc(size, device, torch.cuda.current_stream(device))

        def free(ptr: int, device: int) -> None:
            torch.cuda.caching_allocator_delete(ptr)

        cp.cuda.set_allocator(cp.cuda.memory.PythonFunctionAllocator(malloc, free).malloc)
        set_free_memory(torch_free_memory)
        from .. import api

        # heuristic mode benchmarks in a thread of its own: its buffers are marked there and given back by the
        # next prepared launch on the launching thread (:func:`release_cached`), never from the benchmark's thread
        api.after_background_benchmark.append(_mark_for_release)
        global _cp
        _cp = cp
        _shared = True


def torch_free_memory(device: int) -> int:
    """What torch's caching allocator may still take on ``device``: the device's free memory plus the blocks it
    caches unused, and under ``set_per_process_memory_fraction`` no more than that cap less what is allocated
    (the allocator releases its cached blocks before it reports an out-of-memory, so they count as free)."""
    free, total = torch.cuda.mem_get_info(device)
    allocated = torch.cuda.memory_allocated(device)
    room = free + torch.cuda.memory_reserved(device) - allocated
    fraction = torch.cuda.get_per_process_memory_fraction(device) if _HAS_FRACTION else 1.0
    if fraction < 1.0:
        room = min(room, int(fraction * total) - allocated)
    return max(0, room)


#: whether this torch reads the cap back (where it cannot, benchmarks size their workspace from the device)
_HAS_FRACTION = hasattr(torch.cuda, "get_per_process_memory_fraction")

_raw_getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _raw_stream(device: int) -> int:
    """torch's current stream on ``device`` as a ``cudaStream_t`` (torch's internal getter when it has one:
    it skips building a ``torch.cuda.Stream`` object on every call)."""
    return _raw_getter(device) if _raw_getter is not None else torch.cuda.current_stream(device).cuda_stream


def cupy_stream(device: int) -> Any:
    """CuPy's view of torch's current stream on ``device`` (cached per stream)."""
    ptr = _raw_stream(device)
    s = _streams.get((device, ptr))
    if s is None:
        from ..binding.gpu import cupy

        cp = cupy()
        try:    # CuPy 14: through the CUDA stream protocol, which torch's streams implement
            s = cp.cuda.Stream.from_external(torch.cuda.current_stream(device))
        except (AttributeError, TypeError):
            s = cp.cuda.ExternalStream(ptr, device)
        _streams[(device, ptr)] = s
    return s


def executor(problem: ConvProblem, op: str, settings: Settings, numerics: str, device: int) -> Any:
    """The executor for ``(problem, op)``: an installed plan's, else the API's cached one (lookup or benchmark).

    Every setting of the layer goes to the lookup: ``sources`` too ("" : None, the library's default sources),
    since the sources change what is measured and so which plan is right.
    """
    global _release_pending
    from .. import api

    hit = installed.get((device, problem, op))
    if hit is not None:
        return hit.executor
    before = torch.cuda.memory_reserved(device)
    # torch's outputs are fresh tensors written with beta 0: forward and backward data may borrow their unwritten
    # part; a backward filter where its launches bring the layer's dx
    unwritten = (op != "backward_filter" or settings.dx_unwritten) and config.unwritten()
    ex = api._executor(problem, op, settings.workspace_limit, settings.batch_policy or None, numerics,
                       settings.replay, sources=settings.sources or None, unwritten=unwritten)
    if torch.cuda.memory_reserved(device) > before:
        _release_pending = True
        release_cached()
    return ex


#: Set when a lookup grew torch's reserved memory (a benchmark's buffers, which go back to torch's cache when it
#: ends) and the cache could not be emptied at once (a CUDA graph was being captured), or when a background
#: benchmark of heuristic mode ended (its thread only marks); the next launch of an already prepared call gives the
#: cached blocks back (:func:`release_cached`).
#: Why: the benchmark tries workspaces of up to gigabytes, and the caching allocator keeps them for the process:
#: ResNet-50 b128 AMP converted at 64 MiB reserved 10.46 GiB against PyTorch's 6.52 at the same 5.7 GiB allocated
#: (``benchmarks/results/torch_train_amp_b256_caps_h200-notes.md``), memory other processes on the GPU could not use.
#: Released at once, not at the next launch: blocks the step allocates after a benchmark would otherwise be carved
#: from the benchmark's cached segments and pin them (AlexNet b256 FP32 converted at 64 MiB, H200: 5.35 GiB reserved
#: when the release waited for the second step, 2.67 GiB released at once; PyTorch 2.42).
_release_pending = False


def _mark_for_release() -> None:
    global _release_pending
    _release_pending = True


def release_cached() -> None:
    """Give torch's cached, unused blocks back to the device (``torch.cuda.empty_cache``) after a lookup that
    benchmarked: right after the benchmark (:func:`executor`; the benchmark has synchronised the device, so the
    release costs no stall of its own).  Never while a CUDA graph is being captured: then the mark stays and the
    next launch of a prepared call after the capture releases."""
    global _release_pending
    if torch.cuda.is_current_stream_capturing():
        return
    _release_pending = False
    torch.cuda.empty_cache()


class _Call:
    """One kernel made ready for launches from torch: its executor and what the launch needs, derived once.

    Valid while the lookup chain still holds the same executor: :meth:`current` checks, per launch, that the
    installed plan for the kernel (``ucudnn.torch.plan``) is the one seen at preparation, and otherwise that
    ``ucudnn.api``'s in-process cache still maps the executor's key to this executor (heuristic mode swaps in
    the measured plan's executor when its background benchmark ends).  An executor found in neither (a
    caller's own ``api._executor``) is never trusted: such calls are prepared again at every launch.
    """

    __slots__ = ("executor", "installed_key", "installed", "mem_key", "ws_ptr", "ws_size", "ws_bytes",
                 "torch_device", "direct")

    def __init__(self, problem: ConvProblem, op: str, settings: Settings, numerics: str, device: int):
        global _api
        if _api is None:
            from .. import api

            _api = api
        self.installed_key = (device, problem, op)
        self.installed = installed.get(self.installed_key)
        self.executor = executor(problem, op, settings, numerics, device)
        # the in-process cache's key of this executor, found by identity (not recomputed: whatever api keys by)
        self.mem_key = None if self.installed is not None else next(
            (k for k, v in list(_api._executors.items()) if v is self.executor), None)
        if self.installed is not None and self.installed.workspace_ptr is not None:
            self.ws_ptr, self.ws_size, self.ws_bytes = self.installed.workspace_ptr, self.installed.workspace_size, 0
        else:   # ws_bytes > 0: a workspace of that size from torch's allocator for each launch
            self.ws_ptr, self.ws_size, self.ws_bytes = 0, 0, int(self.executor.workspace_bytes)
        self.torch_device = torch.device("cuda", device)
        #: the executor's shortcut for one-step plans (``sources.base.Direct``), else None: :func:`launch`
        self.direct = getattr(self.executor, "direct", None)

    def current(self) -> bool:
        hit = installed.get(self.installed_key) if installed else None
        if hit is not self.installed:
            return False
        if hit is not None:
            return True
        return self.mem_key is not None and _api._executors.get(self.mem_key) is self.executor

    def workspace(self) -> tuple[torch.Tensor | None, int, int]:
        """(the tensor to keep alive for the launch or None, pointer, bytes): an installed WD plan's arena segment,
        else a ``torch.empty`` from torch's caching allocator, back to its pool when the caller drops it
        (stream-ordered, so the launches finish with it first).  Raises :class:`WorkspaceOutOfMemory` when the
        allocator cannot give it."""
        if self.ws_bytes:
            try:
                ws = torch.empty(self.ws_bytes, dtype=torch.uint8, device=self.torch_device)
            except torch.cuda.OutOfMemoryError as e:
                raise WorkspaceOutOfMemory(str(e), self.ws_bytes) from None
            return ws, ws.data_ptr(), self.ws_bytes
        return None, self.ws_ptr, self.ws_size

    def run(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
            unwritten: torch.Tensor | None = None) -> None:
        """One launch on the tensors' memory (CuPy's device and stream already torch's), the workspace from
        :meth:`workspace`; ``unwritten``: a backward filter's layer's dx, not written yet."""
        ws, ptr, size = self.workspace()
        spare = None if unwritten is None or not self.executor.takes_unwritten else (
            unwritten.data_ptr(), unwritten.nbytes)
        self.executor.launch((a.data_ptr(), b.data_ptr(), out.data_ptr()), ptr, size, unwritten=spare)
        del ws


#: (op, problem, settings, numerics, device, environment defaults) -> its prepared call
_calls: dict[tuple, _Call] = {}
#: the same keys -> the settings a kernel runs with since torch's allocator could not give its plan's workspace
#: (:func:`degrade`): the layer's, with a smaller workspace limit
_degraded: dict[tuple, Settings] = {}


class WorkspaceOutOfMemory(torch.cuda.OutOfMemoryError):
    """torch's allocator could not give a call's workspace of ``bytes`` bytes (a memory cap, or a full device):
    :func:`launch` answers with a plan that needs less (:func:`degrade`), not with torch's convolution."""

    def __init__(self, message: str, bytes_: int) -> None:
        super().__init__(message)
        self.bytes = bytes_


def degrade(op: str, problem: ConvProblem, settings: Settings, numerics: str, device: int, failed: int) -> bool:
    """After a workspace of ``failed`` bytes did not fit, make ``(op, problem)`` under these settings run with a
    smaller workspace limit from now on: half of that workspace, and no more than half of what torch's allocator
    may still take (:func:`torch_free_memory`: under a cap, the cap less what is allocated), in whole MiB, 0 at
    the end (a plan of workspace-free configurations, which cannot fail this way).  False when there is nothing
    smaller to try.

    Why: PyTorch under ``set_per_process_memory_fraction`` picks algorithms whose workspace it can allocate; a
    converted layer whose plan was made for its limit would otherwise fail that allocation on every call, each
    failure releasing torch's cached blocks (a device synchronisation) before torch's convolution ran instead
    (AlexNet b256 at 75% of PyTorch's peak, ucudnn at 256 MiB per kernel: 2335 images/s against 11352 at 64 MiB).
    The plan comes from the same measurements (no benchmark); the layer keeps it for the process, and the
    compiled launch path rebuilds its entries (:func:`ucudnn.api.plans_changed`)."""
    if failed <= 0:
        return False
    key = _call_key(op, problem, settings, numerics, device)
    limit = (min(failed // 2, torch_free_memory(device) // 2) >> 20) << 20
    _degraded[key] = replace(settings, workspace_limit=limit)
    _calls.pop(key, None)
    _by_id.clear()
    from .. import api

    api.plans_changed()
    log.warning("ucudnn: %s %s: torch's allocator could not give its plan's %d MiB of workspace; it runs with "
                "%d MiB from now on", op, problem.describe(), failed >> 20, limit >> 20)
    return True


def _call_key(op: str, problem: ConvProblem, settings: Settings, numerics: str, device: int) -> tuple:
    """The key of a prepared call in :data:`_calls` and of its settings in :data:`_degraded` (environment defaults
    last): :func:`prepared` and :func:`degrade` must agree on it."""
    return op, problem, settings, numerics, device, _defaults_env(settings)


def _defaults_env(settings: Settings) -> tuple:
    """The environment variables a layer's defaulted settings are read from (``UCUDNN_BATCH_SIZE_POLICY`` when
    it names no batch policy, ``UCUDNN_SOURCES`` when it names no sources, ``UCUDNN_CHANNEL_POLICY``,
    ``UCUDNN_UNWRITTEN``): part of a
    prepared call's key, so
    a change of them is seen at the next launch, as the lookup chain sees it."""
    get = _environ_get
    policy = None if settings.batch_policy else get(_ENV_KEYS[0])
    sources = None if settings.sources else get(_ENV_KEYS[1])
    channels = get(_ENV_KEYS[2])
    unwritten = get(_ENV_KEYS[3])
    if policy is None and sources is None and channels is None and unwritten is None:
        return _NO_ENV
    return tuple(v if v is None or isinstance(v, str) else os.fsdecode(v)
                 for v in (policy, sources, channels, unwritten))


_NO_ENV = (None, None, None, None)


_ENV_NAMES = ("UCUDNN_BATCH_SIZE_POLICY", "UCUDNN_SOURCES", "UCUDNN_CHANNEL_POLICY", "UCUDNN_UNWRITTEN")
# os.environ's own mapping, read without its per-call key encoding (three reads per launch: measurable host
# time inside a training step); a value that is set is decoded, as os.environ would
_environ_data = getattr(os.environ, "_data", None)
_encodekey = getattr(os.environ, "encodekey", None)
if isinstance(_environ_data, dict) and _encodekey is not None:
    _environ_get, _ENV_KEYS = _environ_data.get, tuple(_encodekey(k) for k in _ENV_NAMES)
else:   # another Python's os.environ
    _environ_get, _ENV_KEYS = os.environ.get, _ENV_NAMES


#: the same prepared calls by object identity: (op, id(problem), id(settings), numerics, device, environment
#: defaults) -> (problem, settings, call).  The layers pass the same few ConvProblem and Settings objects on
#: every call (both cached where they are made), so a launch finds its call without hashing a ConvProblem (its
#: dataclass hash rebuilds a 14-field tuple every time); the entry holds both objects, so their ids stay theirs,
#: and it is trusted only if they are the very objects of this call
_by_id: dict[tuple, tuple[ConvProblem, Settings, _Call]] = {}
_BY_ID_MAX = 4096


def forget_prepared() -> None:
    """Drop every prepared call (the next launch of each kernel prepares it again through the lookup chain)."""
    _by_id.clear()
    _calls.clear()
    from .. import api

    api.plans_changed()


def _ready(op: str, problem: ConvProblem, settings: Settings, numerics: str, device: int,
           env: tuple) -> _Call | None:
    """The prepared call found by identity and still current, else None (:func:`prepared` makes it): no CuPy
    context needed."""
    hit = _by_id.get((op, id(problem), id(settings), numerics, device, env))
    if hit is not None and hit[0] is problem and hit[1] is settings and hit[2].current():
        return hit[2]
    return None


def prepared(op: str, problem: ConvProblem, settings: Settings, numerics: str, device: int) -> _Call:
    """The prepared call of ``(op, problem)`` for these settings on ``device``, made (lookup chain, maybe a
    benchmark) if there is none or the one there is no longer current.  Call with CuPy's device and stream set
    (:func:`launch` does): preparing may benchmark."""
    key = _call_key(op, problem, settings, numerics, device)
    env = key[-1]
    call = _ready(op, problem, settings, numerics, device, env)
    if call is not None:
        return call
    fast = (op, id(problem), id(settings), numerics, device, env)
    call = _calls.get(key)
    if call is None or not call.current():
        call = _calls[key] = _Call(problem, op, _degraded.get(key, settings), numerics, device)
    if len(_by_id) >= _BY_ID_MAX:
        _by_id.clear()
    _by_id[fast] = (problem, settings, call)
    return call


def launch(op: str, problem: ConvProblem, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, settings: Settings,
           numerics: str, unwritten: torch.Tensor | None = None) -> None:
    """``out = op(a, b)`` by ucudnn's plan, on torch's current stream, workspace from torch's allocator.
    ``unwritten``: with ``settings.dx_unwritten``, the backward filter's layer's dx before backward data writes it.

    Raises :class:`~ucudnn.errors.UcudnnError` (or torch's ``OutOfMemoryError``) when ucudnn cannot run it;
    the custom ops catch that and fall back to torch (:func:`fallback_reason`).
    """
    device = a.get_device()
    if not _shared:
        share_torch_memory()
    try:
        call = _ready(op, problem, settings, numerics, device, _defaults_env(settings))
        if call is not None and _release_pending:
            release_cached()
        if call is not None and call.direct is not None and _torch_device() == device:
            # the one-step plans' shortcut: no CuPy context, no executor frames (``sources.base.Direct``)
            ws, ptr, size = call.workspace()
            if call.direct(a.data_ptr(), b.data_ptr(), out.data_ptr(), ptr, size, _raw_stream(device)):
                return
            del ws   # declined: the full launch takes its own
        with _cp.cuda.Device(device), cupy_stream(device):
            (call or prepared(op, problem, settings, numerics, device)).run(a, b, out, unwritten)
    except WorkspaceOutOfMemory as e:
        _launch_degraded(op, problem, a, b, out, settings, numerics, device, e, unwritten)


def _launch_degraded(op: str, problem: ConvProblem, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
                     settings: Settings, numerics: str, device: int, error: WorkspaceOutOfMemory,
                     unwritten: torch.Tensor | None = None) -> None:
    """:func:`launch` after its workspace did not fit: smaller plans (:func:`degrade`) until one's does; the
    error again when no smaller one is left (torch's convolution then runs it)."""
    while degrade(op, problem, settings, numerics, device, error.bytes):
        try:
            with _cp.cuda.Device(device), cupy_stream(device):
                prepared(op, problem, settings, numerics, device).run(a, b, out, unwritten)
            return
        except WorkspaceOutOfMemory as e:
            error = e
    raise error


#: torch's current device (its internal getter when it has one, as for the stream)
_torch_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


#: failures that mean "ucudnn cannot run this convolution here", answered by running torch's instead
FALLBACK_ERRORS = (UcudnnError, torch.cuda.OutOfMemoryError)


def note_fallback(problem: ConvProblem, op: str, error: BaseException) -> None:
    """Log once per (problem, op, kind of failure) why torch ran it instead."""
    kind = "infeasible" if isinstance(error, InfeasibleError) else \
        "no-gpu" if isinstance(error, (GpuUnavailable, CudnnNotFound)) else \
        "cudnn" if isinstance(error, CudnnError) else "oom" if isinstance(error, torch.cuda.OutOfMemoryError) else "other"
    key = (problem, op, kind)
    if key not in _logged:
        _logged.add(key)
        log.warning("ucudnn: %s %s runs through torch: %s", op, problem.describe(), str(error).splitlines()[0])


def log_once(key: tuple, message: str) -> None:
    if key not in _logged:
        _logged.add(key)
        log.warning("ucudnn: %s", message)
