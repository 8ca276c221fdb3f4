"""The Python API: micro-batched convolutions on CuPy arrays.

    y = ucudnn.conv2d_forward(x, w, stride=1, padding=2, workspace_limit="64MiB", batch_policy="powerOfTwo")
    dx = ucudnn.conv2d_backward_data(w, dy, x_shape=x.shape, ...)
    dw = ucudnn.conv2d_backward_filter(x, dy, w_shape=w.shape, ...)

The first call for a (device, cuDNN version, problem, op, numerics, batch
policy, sources) benchmarks that kernel at the policy's micro-batch sizes with
the algorithm sources asked for (``sources=``; default: ``UCUDNN_SOURCES``,
else legacy + graph where ``nvidia-cudnn-frontend`` is installed + fold, see
:mod:`ucudnn.source_names`); the WR plan for the requested limit is then
cached in-process and on disk (the store at ``UCUDNN_DATABASE`` or the user
cache directory), so later calls and later processes skip straight to
execution.  With ``UCUDNN_BENCHMARK=heuristic`` a first call does not wait:
it runs cuDNN's heuristic choice within the limit, micro-batched if needed,
while a background thread benchmarks (:func:`wait_for_benchmarks`).

``replay=True`` runs the plan through ``Executor(replay=True)``: the first call
with a set of buffers captures the plan's steps into a CUDA graph, later calls
with the same buffers (pass ``y=`` / ``dx=`` / ``dw=`` and ``workspace=`` to keep
them fixed) replay it, without the host's per-step launch work.
"""
from __future__ import annotations

import atexit
import functools
import logging
import queue
import threading
import time
import warnings
from typing import Any

from . import config
from . import numerics as num
from . import source_names
from .binding import cudnn
from .binding.gpu import cupy, device_name
from .catalog.store import Store
from .errors import InputError
from .execute.executor import Executor
from .measure.benchmarking import benchmark
from .planning.plan import KernelPlan
from .planning.table import KernelBench
from .planning.wr import RULES
from .policy import key_policy, normalize_policy
from .problem import ConvProblem, KernelSpec
from .units import parse_size

_lock = threading.Lock()
_executors: dict[tuple, Executor] = {}
_store: Store | None = None
_store_failed = False
_plans: dict[str, KernelPlan] = {}  # the lookup's in-process layer (plan key id -> plan)
#: bumped whenever an executor already handed out is replaced (heuristic mode's background benchmark ends, a
#: caller installs plans): launch paths that keep what they derived from an executor (ucudnn.torch's compiled
#: one) compare it per call, one integer, instead of looking the executor up again
generation = 0
log = logging.getLogger("ucudnn")


def _get_store() -> Store | None:
    """The on-disk plan cache, or None (with a warning, once) if it cannot be opened."""
    global _store, _store_failed
    if _store is None and not _store_failed:
        try:
            _store = Store()
        except Exception as e:  # noqa: BLE001 - an unusable cache must not stop a convolution
            _store_failed = True
            warnings.warn(f"ucudnn: plan cache unavailable ({e}); plans will be benchmarked in every process",
                          RuntimeWarning, stacklevel=3)
    return _store


def _cache_key(problem: ConvProblem, op: str, numerics: str, batch_policy: str, limit: int | None = None,
               sources: tuple[str, ...] = (source_names.LEGACY_ONLY,), unwritten: bool = False) -> dict:
    """The kernel-cache key: device, cuDNN version, problem, op, numerics, batch policy, sources (left out for legacy
    alone, so keys written before sources joined the key still answer), the channel policy every benchmark here
    runs under (``UCUDNN_CHANNEL_POLICY``; left out for ``none``, likewise), the batch policy as
    :func:`ucudnn.policy.key_policy` names it (one name for policies with the same sizes), and the limit for a
    plan's key, with
    ``unwritten: true`` for a plan that may take workspace from output not written yet (left out otherwise),
    ``host_ties: false`` for a plan made without host near-ties (``UCUDNN_HOST_TIES=0``; left out otherwise) and
    ``wr_rules``, the version of WR's choices (:data:`ucudnn.planning.wr.RULES`: a plan an earlier version cached
    is planned again from the cached measurements)."""
    key = {"device": device_name(), "cudnn_version": cudnn.get_version(), "problem": problem.to_dict(), "op": op,
           "numerics": numerics, "batch_policy": key_policy(batch_policy, problem.n)}
    field = source_names.key_field(sources, op, problem)
    if field is not None:
        key["sources"] = field
    channels = config.channel_policy()
    if channels != "none":
        key["channel_policy"] = channels
    if limit is not None:
        key["workspace_limit"] = limit
        if unwritten:
            key["unwritten"] = True
        if not config.host_ties():
            key["host_ties"] = False
        key["wr_rules"] = RULES
    return key


def get_plan(problem: ConvProblem, op: str, *, workspace_limit: int | str | None = None,
             batch_policy: str | None = None, numerics: str | None = None,
             sources: str | list[str] | None = None, unwritten: bool | None = None) -> KernelPlan:
    """The WR plan for one kernel, from the first layer that has it (see :mod:`ucudnn.catalog.lookup`), else
    benchmarked now (``UCUDNN_BENCHMARK=heuristic``: cuDNN's heuristic plan until the benchmark is done).
    ``unwritten``: whether it may take workspace from output not written yet; None, as ``conv2d_*`` runs it with
    ``beta = 0`` (``UCUDNN_UNWRITTEN`` for forward and backward data; a backward filter without a dx buffer: no)."""
    if unwritten is None:
        unwritten = op != "backward_filter" and config.unwritten()
    return _executor(problem, op, workspace_limit, batch_policy, numerics, sources=sources,
                     unwritten=unwritten).plan


@functools.lru_cache(maxsize=256)
def _names(sources: str | tuple[str, ...]) -> tuple[str, ...]:
    from .measure.sources import registry

    return source_names.canonical(sources, known=registry.known())


def _source_names(sources: Any) -> tuple[str, ...]:
    """Canonical source names (None: the defaults, read each call so ``UCUDNN_SOURCES`` changes are seen)."""
    if sources is None:
        return source_names.default_names()
    return _names(sources if isinstance(sources, str) else tuple(sources))


def _executor(problem: ConvProblem, op: str, workspace_limit: Any, batch_policy: str | None,
              numerics: str | None, replay: bool = False, sources: Any = None,
              unwritten: bool = False) -> Executor:
    """The cached executor of a kernel's plan.  ``unwritten``: the plan may take workspace from memory the call has
    not written yet (the caller runs it with ``beta = 0``, and a backward filter passes its layer's dx)."""
    limit = parse_size(workspace_limit if workspace_limit is not None else config.default_workspace_limit(),
                       "workspace_limit")
    bp = normalize_policy(batch_policy or config.batch_policy())
    nm = num.normalize(numerics, problem.dtype)
    names = _source_names(sources)
    mem_key = (cupy().cuda.Device().id, problem, op, limit, bp, nm, names, config.channel_policy(), bool(unwritten),
               bool(replay))
    ex = _executors.get(mem_key)
    if ex is not None:
        return ex
    with _lock:
        ex = _executors.get(mem_key)
        if ex is None:
            ex = _executors[mem_key] = Executor(
                _plan_from_store_or_bench(problem, op, limit, bp, nm, names, bool(unwritten)), replay=bool(replay))
    return ex


def plans_changed() -> None:
    """Say that executors handed out may have been replaced (:data:`generation`)."""
    global generation
    generation += 1


class _Deferred(Exception):
    """Raised in place of a benchmark in heuristic mode: no cache layer had the plan."""


def _lookup(problem: ConvProblem, op: str, limit: int, bp: str, nm: str, names: tuple[str, ...],
            benchmark_now: bool = True, unwritten: bool = False) -> KernelPlan:
    """The lookup chain (in-process, user cache, plan server, installed bundles, the same kernel at a larger batch:
    :mod:`ucudnn.catalog.lookup`), then a benchmark here, or :class:`_Deferred` instead of one when
    ``benchmark_now`` is False."""
    from .catalog import lookup

    def measure() -> Any:
        if not benchmark_now:
            raise _Deferred
        return benchmark([KernelSpec(f"{op}", op, problem)], bp, nm, sources=list(names)).kernels[0]

    def measure_batch(sizes: list[int]) -> Any:   # only these sizes: the rest comes from a larger batch's table
        if not benchmark_now:
            raise _Deferred
        got = benchmark([KernelSpec(f"{op}@{m}", op, problem.with_batch(m)) for m in sizes], "undivided", nm,
                        sources=list(names)).kernels
        seconds = [k.benchmark_seconds for k in got if k.benchmark_seconds is not None]
        return KernelBench(op, op, problem, [m for k in got for m in k.measurements],
                           [s for k in got for s in k.skipped], sum(seconds) if seconds else None)

    return lookup.kernel_plan(
        _cache_key(problem, op, nm, bp, limit, names, unwritten), _cache_key(problem, op, nm, bp, sources=names),
        benchmark=measure, memory=_plans, store=_get_store(), server=lookup.server_from_env(),
        bundles=lookup.installed_bundles(), measure_batch=measure_batch).plan


def _plan_from_store_or_bench(problem: ConvProblem, op: str, limit: int, bp: str, nm: str,
                              sources: Any = None, unwritten: bool = False) -> KernelPlan:
    """The plan an executor starts with: looked up, else benchmarked here; in heuristic mode
    (``UCUDNN_BENCHMARK=heuristic``), when no cache layer has it, cuDNN's heuristic plan now and the benchmark
    in the background (:func:`wait_for_benchmarks`)."""
    names = _source_names(sources)
    if config.benchmark_mode() != "heuristic":
        return _lookup(problem, op, limit, bp, nm, names, unwritten=unwritten)
    try:
        return _lookup(problem, op, limit, bp, nm, names, benchmark_now=False, unwritten=unwritten)
    except _Deferred:
        plan = _from_a_larger_batch_now(problem, op, limit, bp, nm, names)
        if plan is None:
            from .measure.heuristic import heuristic_plan

            plan = heuristic_plan(problem, op, limit, bp, nm)
        _background.submit((cupy().cuda.Device().id, problem, op, limit, bp, nm, names, config.channel_policy(),
                            unwritten))
        return plan


def _from_a_larger_batch_now(problem: ConvProblem, op: str, limit: int, bp: str, nm: str,
                             names: tuple[str, ...]) -> KernelPlan | None:
    """Heuristic mode's first plan where the user cache or a bundle holds this kernel at a larger batch: WR over
    that batch's micro-batches below this one (measured plans, against cuDNN's untimed heuristic choice), not
    stored (the sizes that batch lacks -- this batch's own, an odd batch's even splits -- are missing: the
    background benchmark measures them and replaces the plan).  None
    where there is no such batch or nothing below this one fits the limit."""
    from .catalog import lookup, near_keys

    bench_key = _cache_key(problem, op, nm, bp, sources=names)
    try:
        found = near_keys.find_larger_batch(bench_key, (bench_key["device"], bench_key["cudnn_version"]),
                                            _get_store(), lookup.installed_bundles(), None)
        if found is None:
            return None
        kb = near_keys.from_larger_batch(found[1], bench_key, lambda sizes: KernelBench(op, op, problem, []))
        return None if kb is None else lookup.wr_plan(kb, {**bench_key, "workspace_limit": limit})
    except Exception as e:  # noqa: BLE001 - infeasible below this batch, an unreadable cache: cuDNN's heuristic
        log.debug("ucudnn: no plan from a larger batch for %s %s: %s", op, problem.describe(), e)
        return None


#: Called, without arguments and from the benchmarking thread, each time a background benchmark of heuristic mode
#: has ended (measured or failed): the torch layer marks the benchmark's buffers, which torch's caching allocator
#: keeps once freed, to be given back at its next launch (``ucudnn.torch.runtime.share_torch_memory``).
after_background_benchmark: list = []


class _Background:
    """One daemon thread that benchmarks, one kernel at a time, what heuristic mode ran without a benchmark.

    One at a time and on a stream of its own: two benchmarks on one GPU would time each other.  When a
    kernel is done its measurements are in the caches (so later processes skip straight to the plan) and
    every executor made from its heuristic plan is replaced by one of the measured plan; the call in flight
    finishes on the old one.  A failed benchmark keeps the heuristic plan and logs why.
    """

    #: Seconds without a new submission before a benchmark starts: a model's first forward pass submits one
    #: kernel per layer, and a benchmark started under it would compete with those first calls for the GPU
    #: (cudnnFind's allocations synchronise the device), which is what heuristic mode exists to avoid.
    START_DELAY_S = 1.0

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._pending: set[tuple] = set()
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self._last_submit = 0.0
        self._stopping = False
        atexit.register(self.stop)

    def stop(self) -> None:
        """Start no further benchmark (at interpreter exit: the one under way, if any, is abandoned with the
        daemon thread; what it had measured is not stored, so the next process benchmarks that kernel)."""
        with self._cond:
            self._stopping = True

    def submit(self, key: tuple) -> None:
        """Benchmark ``(device, problem, op, limit, batch policy, numerics, sources, channel policy)`` (once, however
        often asked)."""
        with self._cond:
            if key in self._pending:
                return
            self._pending.add(key)
            self._last_submit = time.monotonic()
            self._queue.put(key)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ucudnn-benchmark", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            key = self._queue.get()
            device, problem, op = key[:3]
            while (quiet := time.monotonic() - self._last_submit) < self.START_DELAY_S:
                time.sleep(self.START_DELAY_S - quiet)
            if self._stopping:
                with self._cond:
                    self._pending.discard(key)
                    self._cond.notify_all()
                continue
            try:
                cp = cupy()
                with cp.cuda.Device(device), cp.cuda.Stream(non_blocking=True):
                    # the channel policy (key[7]) is the environment's, read there
                    plan = _lookup(*key[1:7], unwritten=key[8])
                with _lock:
                    for mem_key, old in list(_executors.items()):
                        if mem_key[:-1] == key:
                            _executors[mem_key] = Executor(plan, replay=old.replay)
                    plans_changed()
            except Exception as e:  # noqa: BLE001 - the heuristic plan keeps running
                log.warning("ucudnn: background benchmark of %s %s failed; cuDNN's heuristic plan stays: %s",
                            op, problem.describe(), e)
            finally:
                for listener in list(after_background_benchmark):
                    try:
                        listener()
                    except Exception as e:  # noqa: BLE001 - a listener's failure must not stop the benchmarks
                        log.warning("ucudnn: a listener of background benchmarks failed: %s", e)
                with self._cond:
                    self._pending.discard(key)
                    self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending, timeout)


_background = _Background()


def wait_for_benchmarks(timeout: float | None = None) -> bool:
    """Block until the background benchmarks of heuristic mode (``UCUDNN_BENCHMARK=heuristic``) are done, so
    later calls run measured plans; True when none is left (False: ``timeout`` seconds passed first).

    Call it before capturing CUDA graphs: a benchmark running in another thread would break the capture.
    """
    return _background.wait(timeout)


def _layout_of(x: Any, layout: str | None) -> str:
    layout = layout or "NCHW"
    if layout not in ("NCHW", "NHWC"):
        raise InputError(f"must be NCHW or NHWC, got {layout!r}", "layout")
    return layout


def _problem(x_shape, w_shape, layout: str, dtype: str, stride, padding, dilation, groups) -> ConvProblem:
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise InputError("x and w must be 4-D", "x")
    if layout == "NCHW":
        n, c, h, w_ = x_shape
        k, _, r, s = w_shape
    else:
        n, h, w_, c = x_shape
        k, r, s, _ = w_shape
    return ConvProblem(int(n), int(c), int(h), int(w_), int(k), int(r), int(s), padding, stride, dilation, groups,
                       dtype, layout)


def conv2d_forward(x: Any, w: Any, *, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1,
                   layout: str | None = None, workspace_limit: int | str | None = None,
                   batch_policy: str | None = None, numerics: str | None = None, y: Any = None,
                   alpha: float = 1.0, beta: float = 0.0, workspace: Any = None, replay: bool = False,
                   sources: str | list[str] | None = None) -> Any:
    """y = alpha * conv(x, w) + beta * y, micro-batched to fit ``workspace_limit`` (default 64 MiB).  With
    ``beta = 0`` a micro-batch may take workspace from the y of the samples after it (``UCUDNN_UNWRITTEN``)."""
    layout = _layout_of(x, layout)
    p = _problem(x.shape, w.shape, layout, str(x.dtype), stride, padding, dilation, groups)
    ex = _executor(p, "forward", workspace_limit, batch_policy, numerics, replay, sources,
                   unwritten=beta == 0 and config.unwritten())
    if y is None:
        y = cupy().empty(p.y_shape(), dtype=x.dtype)
    return ex(x, w, y, alpha=alpha, beta=beta, workspace=workspace)


def conv2d_backward_data(w: Any, dy: Any, x_shape: tuple[int, ...], *, stride: Any = 1, padding: Any = 0,
                         dilation: Any = 1, groups: int = 1, layout: str | None = None,
                         workspace_limit: int | str | None = None, batch_policy: str | None = None,
                         numerics: str | None = None, dx: Any = None, alpha: float = 1.0, beta: float = 0.0,
                         workspace: Any = None, replay: bool = False,
                         sources: str | list[str] | None = None) -> Any:
    """dx = alpha * conv_transpose(dy, w) + beta * dx (the gradient with respect to x).  With ``beta = 0`` a
    micro-batch may take workspace from the dx of the samples after it (``UCUDNN_UNWRITTEN``)."""
    layout = _layout_of(dy, layout)
    p = _problem(tuple(x_shape), w.shape, layout, str(dy.dtype), stride, padding, dilation, groups)
    ex = _executor(p, "backward_data", workspace_limit, batch_policy, numerics, replay, sources,
                   unwritten=beta == 0 and config.unwritten())
    if dx is None:
        dx = cupy().empty(p.x_shape(), dtype=dy.dtype)
    return ex(w, dy, dx, alpha=alpha, beta=beta, workspace=workspace)


def conv2d_backward_filter(x: Any, dy: Any, w_shape: tuple[int, ...], *, stride: Any = 1, padding: Any = 0,
                           dilation: Any = 1, groups: int = 1, layout: str | None = None,
                           workspace_limit: int | str | None = None, batch_policy: str | None = None,
                           numerics: str | None = None, dw: Any = None, alpha: float = 1.0, beta: float = 0.0,
                           workspace: Any = None, replay: bool = False,
                           sources: str | list[str] | None = None, unwritten: Any = None) -> Any:
    """dw = alpha * sum over the batch of x (*) dy + beta * dw; micro-batches accumulate into dw.

    ``unwritten``: the layer's dx buffer (a CuPy array of x's shape and dtype) before its backward data writes
    it; given, the plan may take workspace from there (``UCUDNN_UNWRITTEN``), and its contents are garbage after."""
    layout = _layout_of(x, layout)
    p = _problem(x.shape, tuple(w_shape), layout, str(x.dtype), stride, padding, dilation, groups)
    if unwritten is not None and (tuple(unwritten.shape) != tuple(x.shape) or unwritten.dtype != x.dtype):
        raise InputError(f"the unwritten dx buffer has shape {tuple(unwritten.shape)} and dtype {unwritten.dtype}; "
                         f"x's are {tuple(x.shape)} and {x.dtype}", "unwritten")
    ex = _executor(p, "backward_filter", workspace_limit, batch_policy, numerics, replay, sources,
                   unwritten=unwritten is not None and config.unwritten())
    if dw is None:
        dw = cupy().empty(p.w_shape(), dtype=x.dtype)
    return ex(x, dy, dw, alpha=alpha, beta=beta, workspace=workspace,
              unwritten=unwritten if ex.takes_unwritten else None)


class Conv2d:
    """A convolution layer's three kernels with fixed hyper-parameters and limits.

    ``forward(x, w)``, ``backward_data(w, dy, x_shape)``, ``backward_filter(x, dy, w_shape)``
    keep the layer's stride / padding / limit so call sites stay short.
    """

    def __init__(self, *, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1,
                 layout: str | None = None, workspace_limit: int | str | None = None,
                 batch_policy: str | None = None, numerics: str | None = None, replay: bool = False,
                 sources: str | list[str] | None = None):
        self.kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout,
                       workspace_limit=workspace_limit, batch_policy=batch_policy, numerics=numerics, replay=replay,
                       sources=None if sources is None else ",".join(source_names.canonical(sources)))

    def forward(self, x: Any, w: Any, **kw: Any) -> Any:
        return conv2d_forward(x, w, **self.kw, **kw)

    def backward_data(self, w: Any, dy: Any, x_shape: tuple[int, ...], **kw: Any) -> Any:
        return conv2d_backward_data(w, dy, x_shape, **self.kw, **kw)

    def backward_filter(self, x: Any, dy: Any, w_shape: tuple[int, ...], **kw: Any) -> Any:
        return conv2d_backward_filter(x, dy, w_shape, **self.kw, **kw)
