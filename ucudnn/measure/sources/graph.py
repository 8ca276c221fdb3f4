"""cuDNN graph-API engines as micro-configurations (cuDNN 9 backend through ``nvidia-cudnn-frontend``).

Why a second source: the legacy API offers at most 8 algorithms per op, while
the graph API's heuristics (modes A, B and the fallback list) offer dozens of
engine configurations per convolution, and on Hopper the best of them are
often several times faster than any legacy algorithm under the same
workspace (issue 6).  To the planner they are just more (micro-batch, time,
workspace) rows.

What a measurement records
    ``algo`` — the engine tag ``eng<id>_k<knob>=<value>...`` (for reading);
    ``engine`` — the identity the exact plan is rebuilt from: ``{"id": <global
    engine index>, "knobs": {"<cudnnBackendKnobType_t>": <choice>}}``;
    ``math_type`` — a label derived from the engine's numerical notes, in the
    legacy vocabulary so :meth:`BenchmarkTable.restricted` means the same for
    both sources: ``FMA`` (no tensor cores), ``TENSOR_OP`` (tensor cores, i.e.
    TF32 for float32 data), ``TENSOR_OP_ALLOW_CONVERSION`` (down-converted
    inputs or reduced-precision reduction);
    ``extra`` — ``notes`` (numerical notes, when known), ``behavior_notes``,
    ``deterministic``, ``heuristic_rank``, ``build_ms``, ``accumulate_ms``.

Numerics (never mixed): the mode's excluded notes are removed with the
frontend's own filter (``deselect_numeric_notes``), so the decision rests on
cuDNN's notes, not on this module's bookkeeping: ``strict`` drops
TENSOR_CORE (for float32 data), DOWN_CONVERT_INPUTS and
REDUCED_PRECISION_REDUCTION; ``tf32`` drops the latter two; ``default`` drops
nothing; ``-deterministic`` also drops NONDETERMINISTIC.  The frontend has
no per-plan numerical-note query, so the notes recorded for a measurement
come from probe graphs (one per note whose presence the filter leaves open):
a probe keeps only engines *with* the note and refuses every workspace, so
its check either says "deselected" (note absent) or "workspace violation"
(note present) without building anything.  Notes are a property of the
engine (``CUDNN_ATTR_ENGINE_NUMERICAL_NOTE``), so they are probed once per
(op, problem, engine id) and reused across micro-batch sizes, and a probe
graph holds the engine alone, made from its id (``create_execution_plan``)
rather than through a heuristics query (issue 16: the queries made the probes
6.1 of AlexNet FP16 NHWC's 33 benchmark seconds); where the frontend cannot
tell that way, probe graphs lined up with the heuristics list answer.

Host work ahead (issue 16): a configuration list's preparation (graph,
heuristics, builds, note probes) is host-only, so the benchmark queues it on
the overlap helper (:mod:`.overlap`, :meth:`GraphSource.prefetch`), which runs
it while legacy's Find waits on the GPU; :meth:`GraphSource.measure` takes the
result, or prepares inline what the helper has not reached.  Plans built there
hold the helper's cuDNN handle and run with the caller's (the frontend's
``execute_plan_at_index`` takes the handle to run with).

Lists reused across sizes (issue 16, ``reuse_lists``): heuristic mode B's
query is most of the heuristics' host time; where a kernel's list at the
previous size was complete (nothing cut by ``top_k``), the next size asks the
other modes only and makes every configuration the previous size admitted that
they do not list from its engine id and knobs (``create_execution_plan``).
A configuration that cannot be made so (a knob the frontend does not name)
sends that size back to every mode; a plan measured so is rebuilt the same way
where a later process's heuristics do not list it.

Backward filter: the frontend builds wgrad with alpha = 1, beta = 0 and
offers no way to accumulate.  A micro-batched filter gradient must sum over
micro-batches, so when beta != 0 the engine writes into a scratch buffer
placed in the workspace right after the engine's own workspace, and
``cudnnTransformTensor`` adds it in (out = alpha * scratch + beta * out).
Backward-filter measurements therefore time this accumulating path and
count the scratch buffer in ``workspace_bytes``; ``accumulate_ms`` records
what the addition alone costs.

Alignment: graph-API tensors are declared 16-byte aligned.  Micro-batch
slices start at ``offset * per-sample bytes``, which is not always a
multiple of 16 (AlexNet conv1: 3x227x227 float32 samples); such operands are
staged through aligned temporaries from CuPy's pool (rare, small: a plan's
tail micro-batches), never run misaligned.

Pruning (benchmarking cost): ``top_k`` times only the first k configurations
(in heuristic order) that build at each size; ``quick_margin`` times every
configuration once and repeats the timing only for those not dominated (a
configuration needing no more workspace is faster by the margin) — a
dominated configuration can never be WR's choice at that size.  The quick
sample is this source's cheap first estimate (the graph API has no Find), so
it plays the role Find's times play for legacy: without ``quick_margin`` the
benchmark's ``BenchSettings.prune_margin`` applies (the same rule,
:func:`~ucudnn.measure.sources.base.dominated`), and once the kernel's budget
is spent the quick sample is recorded.  Early stop: configurations are timed
fastest-quick-sample first, and one whose quick sample (its first sample) is
hopeless against the best median so far keeps that sample
(:meth:`~ucudnn.measure.sources.base.Pruner.hopeless`).  Split dominance
(``BenchSettings.split_margin``, :class:`~ucudnn.measure.sources.base.SplitReference`): an engine whose
time at the largest smaller size (a lower bound of its time here) is over the margin times what WR can
already do at this size within its workspace (smaller micro-batches measured before, or a configuration
recorded here before) is not run at all: left out, listed in ``skipped`` as ``split-dominated`` (stats
``configs_split_skipped``); one whose quick sample is over it keeps the quick sample
(``extra["pruned"] = "split-dominated"``, ``configs_split_quick``).  On AlexNet b256 FP32 strict most of the
quick samples' time went to slow engines at the large sizes that two smaller micro-batches beat.
"""
from __future__ import annotations

import ctypes
import glob
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Iterable, Sequence

from ... import numerics as num
from ...binding.timing import HostRecorder
from ...errors import CudnnError, InputError, UcudnnError
from ...planning.table import Measurement, Skipped
from ...problem import ROLES, ConvProblem
from .base import (BenchSettings, Launch, Native, Operands, Prepared, Pruner, dominated, host_extra, time_config,
                   timed_beta)

#: Heuristic modes asked for, in this order (their lists are concatenated; duplicates are measured once).
HEUR_MODES: tuple[str, ...] = ("A", "B", "FALLBACK")
#: cudnnBackendNumericalNote_t names the frontend exposes.
NOTES: tuple[str, ...] = ("TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "FFT",
                          "NONDETERMINISTIC", "WINOGRAD", "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6",
                          "WINOGRAD_TILE_13x13", "STRICT_NAN_PROP")
#: Notes whose presence matters to numerics modes (the ones a mode may exclude).
NUMERIC_NOTES: tuple[str, ...] = ("TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION",
                                  "NONDETERMINISTIC")
#: Graph-API tensors' declared alignment (the frontend's default) and the uids of (a, b, out).
ALIGNMENT = 16
UIDS = (1, 2, 3)
#: A trusted quick sample (one call of ``trust_estimate_ms`` or more) within this factor of WR's best at its size,
#: either way, is timed once more (:meth:`GraphSource._quick`): a lone call reads high by its launch gap (2.5-13%
#: on an H100).
NEAR_TIE = 1.15
#: cudnnBackendKnobType_t names by number (cuDNN 9's cudnn_backend.h), to find the frontend's ``knob_type`` of a tag's
#: knob; the frontend names only some of them (not USE_TEX, 3, for one).
BACKEND_KNOBS: tuple[str, ...] = (
    "SPLIT_K", "SWIZZLE", "TILE_SIZE", "USE_TEX", "EDGE", "KBLOCK", "LDGA", "LDGB", "CHUNK_K", "SPLIT_H", "WINO_TILE",
    "MULTIPLY", "SPLIT_K_BUF", "TILEK", "STAGES", "REDUCTION_MODE", "CTA_SPLIT_K_MODE", "SPLIT_K_SLC", "IDX_MODE",
    "SLICED", "SPLIT_RS", "SINGLEBUFFER", "LDGC", "SPECFILT", "KERNEL_CFG", "WORKSPACE", "TILE_CGA", "TILE_CGA_M",
    "TILE_CGA_N", "BLOCK_SIZE", "OCCUPANCY", "ARRAY_SIZE_PER_THREAD", "NUM_C_PER_BLOCK", "SPLIT_COLS", "TILE_ROWS",
    "TILE_COLS", "LOAD_SIZE")
_TAG = re.compile(r"^eng(\d+)((?:_k\d+=-?\d+)*)$")
_KNOB = re.compile(r"_k(\d+)=(-?\d+)")


# --- pure parts: numerics and identity (no GPU, no frontend) ----------------------------------
def excluded_notes(numerics: str, dtype: str) -> tuple[str, ...]:
    """Numerical notes an engine must not carry under ``numerics`` for ``dtype`` data (see module doc)."""
    base = num.normalize(numerics, dtype).partition("-")[0]
    out: list[str] = []
    if base == "strict" and dtype == "float32":
        out.append("TENSOR_CORE")
    if base in ("strict", "tf32"):
        out += ["DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION"]
    if num.deterministic_only(numerics):
        out.append("NONDETERMINISTIC")
    return tuple(out)


def probed_notes(numerics: str, dtype: str) -> tuple[str, ...]:
    """Numeric notes the mode's filter leaves open: their presence must be probed to be recorded."""
    ex = set(excluded_notes(numerics, dtype))
    return tuple(n for n in NUMERIC_NOTES if n not in ex)


def admissible(notes: Iterable[str], numerics: str, dtype: str) -> bool:
    """True iff an engine with ``notes`` may be used under ``numerics`` (the filter's rule, for checks)."""
    return not set(notes) & set(excluded_notes(numerics, dtype))


def math_type_label(notes: Iterable[str] | None, numerics: str, dtype: str) -> str:
    """The legacy-vocabulary label of an engine's math (see module doc).

    With unknown notes the label is the most permissive the mode allows, so a
    label never claims stricter math than the filter guarantees.
    """
    if notes is None:
        ex = set(excluded_notes(numerics, dtype))
        if {"DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION"} <= ex:
            return "FMA" if "TENSOR_CORE" in ex else "TENSOR_OP"
        return "TENSOR_OP_ALLOW_CONVERSION"
    notes = set(notes)
    if notes & {"DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION"}:
        return "TENSOR_OP_ALLOW_CONVERSION"
    return "TENSOR_OP" if "TENSOR_CORE" in notes else "FMA"


@dataclass(frozen=True)
class EngineIdentity:
    """A graph-API engine configuration: global engine index + knob choices (cudnnBackendKnobType_t -> value).

    Together with the problem at its micro-batch size (and the table's cuDNN
    version and device) this names exactly one execution plan.
    """

    engine_id: int
    knobs: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "knobs", tuple(sorted((int(k), int(v)) for k, v in self.knobs)))

    @property
    def tag(self) -> str:
        """The frontend's plan name, knobs sorted: ``eng28_k2=3_k13=1``."""
        return f"eng{self.engine_id}" + "".join(f"_k{k}={v}" for k, v in self.knobs)

    @classmethod
    def parse_tag(cls, tag: str) -> "EngineIdentity":
        """Read a frontend plan name (``get_plan_name_at_index``)."""
        m = _TAG.match(tag.strip())
        if not m:
            raise InputError(f"not an engine tag: {tag!r} (expected eng<id>_k<knob>=<value>...)", "engine")
        knobs = [(int(k), int(v)) for k, v in _KNOB.findall(m.group(2))]
        if len({k for k, _ in knobs}) != len(knobs):
            raise InputError(f"engine tag {tag!r} sets a knob twice", "engine")
        return cls(int(m.group(1)), tuple(knobs))

    def to_json(self) -> dict[str, Any]:
        return {"id": self.engine_id, "knobs": {str(k): v for k, v in self.knobs}}

    @classmethod
    def from_json(cls, obj: Any, field: str = "engine") -> "EngineIdentity":
        """Validate and read ``{"id": int, "knobs": {"<knob type>": int}}``; errors name ``field``."""
        if isinstance(obj, str):
            return cls.parse_tag(obj)
        if not isinstance(obj, dict):
            raise InputError(f"expected an object with id and knobs, got {type(obj).__name__}", field)
        eid = obj.get("id")
        if not isinstance(eid, int) or isinstance(eid, bool) or eid < 0:
            raise InputError(f"must be a non-negative integer, got {eid!r}", f"{field}.id")
        knobs = obj.get("knobs", {})
        if not isinstance(knobs, dict):
            raise InputError(f"expected an object of knob type -> value, got {type(knobs).__name__}", f"{field}.knobs")
        pairs = []
        for k, v in knobs.items():
            if not str(k).isdigit():
                raise InputError(f"knob types are cudnnBackendKnobType_t numbers, got {k!r}", f"{field}.knobs")
            if not isinstance(v, int) or isinstance(v, bool):
                raise InputError(f"knob {k} must be an integer, got {v!r}", f"{field}.knobs.{k}")
            pairs.append((int(k), v))
        return cls(eid, tuple(pairs))


def scratch_bytes(op: str, problem: ConvProblem) -> int:
    """Extra workspace a micro-batch needs to accumulate: one filter gradient (backward filter), one dx
    micro-batch (backward data of a channel slice, which adds into dx: issue 18), else 0."""
    if op == "backward_filter":
        return _bytes("w", problem)
    if op == "backward_data" and problem.k_total is not None:
        return _bytes("x", problem)
    return 0


def blend_of(op: str, problem: ConvProblem, engine_bytes: int) -> tuple[int, int, int] | None:
    """How a step of ``op`` on ``problem`` accumulates through an engine built with beta 0, for a launch path that
    runs it without this module's launcher (ucudnn.torch's compiled one): (the output's legacy descriptor, the
    scratch's offset in the step's workspace, the output's bytes) -- the engine writes into that scratch, then
    ``cudnnTransformTensor`` adds it into the output, as :meth:`GraphSource._run_staged` does.  None for an op
    that never accumulates (forward; backward data of the whole K)."""
    from ...planning.arena import align_up

    extra = scratch_bytes(op, problem)     # the output's bytes, for the ops that accumulate
    if not extra:
        return None
    return _output_descriptor(op, problem), align_up(engine_bytes), extra


def plan_workspace(engine_bytes: int, op: str, problem: ConvProblem) -> int:
    """What a measurement needs: the engine's workspace, plus (backward filter) the aligned scratch after it."""
    from ...planning.arena import align_up

    extra = scratch_bytes(op, problem)
    return align_up(engine_bytes) + extra if extra else engine_bytes


def tensor_layout(problem: ConvProblem) -> dict[str, tuple[list[int], list[int]]]:
    """(dims, strides) of x, w, y as the graph API wants them: dims always N,C,H,W / K,C,R,S; strides by layout."""
    p = problem
    cg = p.c // p.groups

    def strides(n_: int, c_: int, h_: int, w_: int) -> list[int]:
        if p.layout == "NCHW":
            return [c_ * h_ * w_, h_ * w_, w_, 1]
        return [h_ * w_ * c_, 1, w_ * c_, c_]

    return {"x": ([p.n, p.c, p.h, p.w], strides(p.n, p.c, p.h, p.w)),
            "w": ([p.k, cg, p.r, p.s], strides(p.k, cg, p.r, p.s)),
            "y": ([p.n, p.k, p.p, p.q], list(p.y_strides()))}   # a channel slice's y is a view (issue 18)


def classify_failure(message: str) -> str:
    """A short reason for a configuration the frontend refused to build (from its error text)."""
    if "Deselecting execution plan" in message:
        return "deselected by numerical notes"
    if "workspace violation" in message:
        return "needs more workspace than the benchmark offers"
    first = message.strip().splitlines()[0] if message.strip() else "unknown error"
    return f"not supported: {first[:160]}"


# --- loading the frontend ------------------------------------------------------------------------
class GraphUnavailable(UcudnnError):
    """The graph source cannot run here (frontend not installed, or its libraries not loadable)."""


_fe: Any = None
_fe_lock = threading.Lock()


def frontend() -> Any:
    """Import ``cudnn`` (nvidia-cudnn-frontend) after loading the libcudnn ucudnn uses.

    ucudnn's binding loads libcudnn with RTLD_GLOBAL first, so the frontend's
    own dlopen resolves to the same library (one cuDNN per process, handles
    shared).  The frontend also dlopens libcudart by soname; where no
    libcudart is on the loader path, the one in the NVIDIA wheels is preloaded.
    """
    global _fe
    with _fe_lock:
        if _fe is not None:
            return _fe
        from ...binding import cudnn as legacy

        legacy.load()
        _preload_cudart()
        try:
            import cudnn as fe  # the frontend's module name; ucudnn's own binding is ucudnn.cudnn
        except ImportError as e:
            raise GraphUnavailable(f"nvidia-cudnn-frontend is not installed ({e}); pip install 'ucudnn[graph]'") from None
        except Exception as e:  # noqa: BLE001 - e.g. it could not find libcudnn
            raise GraphUnavailable(f"nvidia-cudnn-frontend failed to load: {e}") from None
        if not hasattr(fe, "pygraph") or not hasattr(fe, "heur_mode"):
            raise GraphUnavailable(f"unsupported nvidia-cudnn-frontend {getattr(fe, '__version__', '?')}: "
                                   "no pygraph / heur_mode (ucudnn[graph] pins a supported range)")
        _fe = fe
        return fe


def _preload_cudart() -> None:
    for soname in ("libcudart.so.13", "libcudart.so.12"):
        try:
            ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL)
            return
        except OSError:
            continue
    for entry in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_runtime/lib", "nvidia/cu12/lib"):
            for path in sorted(glob.glob(os.path.join(entry, sub, "libcudart.so.1[23]"))):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                    return
                except OSError:
                    continue


# --- the source -------------------------------------------------------------------------------------
@dataclass
class _Built:
    """One built execution plan: the graph holding it and its index there."""

    graph: Any
    index: int
    engine_bytes: int


@dataclass
class _Candidates:
    """One size's configurations before timing (:meth:`GraphSource._candidates`): the heuristics' graph,
    (index, identity, engine workspace, behavior notes, build ms, heuristic rank) per built one, numerical notes
    per engine id, what was skipped, and each built configuration's plan (most in the heuristics' graph; one made
    from its identity in a graph of its own)."""

    graph: Any
    built: list[tuple[int, "EngineIdentity", int, list[str], float, int]]
    notes: dict[int, frozenset[str] | None]
    skipped: list[Skipped]
    plans: dict["EngineIdentity", _Built] = field(default_factory=dict)


class GraphSource(Prepared):
    """Graph-API engine configurations (see module doc).

    ``top_k`` / ``quick_margin``: pruning (module doc); ``runtime_compiled``:
    also build engines that compile at plan time (NVRTC; seconds each).  The
    injectable ``fe``, ``handle_fn``, ``timer`` and ``blend`` exist so the
    bookkeeping can be tested without a GPU.
    """

    name = "graph"
    channel_slices = True   # tensor_layout gives a channel slice's y its view strides

    def __init__(self, modes: Sequence[str] = HEUR_MODES, top_k: int | None = None,
                 quick_margin: float | None = None, runtime_compiled: bool = False, *,
                 fe: Any = None, handle_fn: Callable[[], int] | None = None,
                 timer: Callable[..., float] | None = None,
                 blend: Callable[[str, ConvProblem, int, int, float, float], None] | None = None,
                 prefetching: bool = True, fast_probe: bool = True, reuse_lists: bool = True):
        bad = [m for m in modes if m not in HEUR_MODES]
        if bad or not modes:
            raise InputError(f"heuristic modes must be among {', '.join(HEUR_MODES)}, got {list(modes)}", "modes")
        if top_k is not None and top_k < 1:
            raise InputError(f"must be a positive integer, got {top_k}", "top_k")
        if quick_margin is not None and quick_margin < 1.0:
            raise InputError(f"must be at least 1.0, got {quick_margin}", "quick_margin")
        self.modes = tuple(modes)
        self.top_k = top_k
        self.quick_margin = quick_margin
        self.runtime_compiled = runtime_compiled
        self.prefetching = prefetching
        self.fast_probe = fast_probe
        self.reuse_lists = reuse_lists
        # per kernel (op, problem at one sample, numerics, cap): whether its last list was complete, at which size,
        # and the configurations it admitted (list reuse: _candidates; emptied by start_benchmark)
        self._lists: dict[tuple, tuple[bool, int, list[tuple[EngineIdentity, list[str]]]]] = {}
        self._knobs: dict[int, Any] | None = None
        self._fe = fe
        self._handle_fn = handle_fn
        self._timer = timer
        self._blend_fn = blend
        self._plans: dict[tuple, _Built] = {}
        self._twins: dict[tuple, Measurement | None] = {}   # legacy configurations' twins (twin), None: none
        self._notes: dict[tuple, frozenset[str] | None] = {}
        self._accumulate_ms: dict[ConvProblem, float] = {}
        self._executed: set[tuple] = set()   # (device, op, engine tag) run at least once (_quick)
        self._lock = threading.RLock()
        self.stats: dict[str, float] = {"heuristics_s": 0.0, "build_s": 0.0, "probe_s": 0.0, "time_s": 0.0,
                                        "configs_built": 0, "configs_timed": 0, "configs_quick_only": 0,
                                        "configs_pruned": 0, "configs_split_skipped": 0, "configs_split_quick": 0,
                                        "prefetched": 0, "prefetch_errors": 0, "probe_graphs": 0,
                                        "lists_full": 0, "lists_reused": 0, "configs_carried": 0,
                                        "configs_confirmed": 0}

    # -- plumbing ---------------------------------------------------------------------------------
    def _frontend(self) -> Any:
        if self._fe is None:
            self._fe = frontend()
        return self._fe

    def _handle(self) -> int:
        if self._handle_fn is None:
            from ...binding.gpu import handle

            self._handle_fn = handle
        return self._handle_fn()

    def _time(self, fn: Callable[[], None], **kw: Any) -> float:
        if self._timer is None:
            from ...binding.timing import time_ms

            self._timer = time_ms
        return self._timer(fn, **kw)

    def _quick(self, fn: Callable[[], None], settings: BenchSettings, engine: Any = None,
               near: Callable[[float], bool] | None = None) -> float:
        """The quick sample: one call timed after one untimed call, except that a first call already as long as
        ``settings.trust_estimate_ms`` is the sample itself (issue 16).  Why: on AlexNet b256 FP32 strict the
        graph source spent 11 of its 20 GPU seconds in quick samples, most of them in slow engines run twice at
        the large micro-batches; a call that long is not changed by warm-up beyond the noise the trust rule
        accepts (:class:`BenchSettings`).

        Except an engine's first execution in this process (``engine``: its (device, op, tag)), which is run once
        untimed first: it loads the engine's kernels (lazy module loading).  Measured on an H100: a 0.1 ms call
        took 13.5 ms the first time, was trusted as the sample at n = 1, and as split dominance's lower bound
        left the engine out at every larger size (AlexNet conv1 forward lost its best configuration, +16.7%).
        The first size an engine appears at is usually the smallest, so the extra call is cheap.

        ``near(ms)`` True: a trusted first call is a near-tie with what WR already has at this size, so it is timed
        once more as a median's samples are (a warm-up call, then one call behind the GPU hold that keeps the launch
        gap out, :mod:`ucudnn.binding.timing`) and the smaller kept.  Why: a lone call reads high by its launch gap
        (H100s, AlexNet b256 FP32 conv1 forward and backward filter at n = 256: 2.09-2.80 ms trusted where the median
        is 2.03-2.48 ms, 2.5-13%), enough to lose to 2 x 128 by a few percent (issue 16's fifth pass)."""
        if engine is not None and engine not in self._executed:
            fn()
            self._executed.add(engine)
        first = self._time(fn, repeat=1, warmup=0, min_sample_ms=0.0)
        if settings.trusts(first):
            if near is not None and near(first):   # a held sample, as a median's are (binding.timing)
                return min(first, self._time(fn, repeat=1, warmup=1, min_sample_ms=0.0))
            return first
        return self._time(fn, repeat=1, warmup=0, min_sample_ms=0.0)

    @staticmethod
    def _device() -> int:
        try:
            from cupy.cuda import runtime

            return int(runtime.getDevice())
        except Exception:  # noqa: BLE001 - no CuPy / no device (fakes): one device
            return 0

    def graph(self, op: str, problem: ConvProblem, handle: int | None = None) -> Any:
        """The operation graph of one op at ``problem.n`` samples, validated and built (no plans yet)."""
        fe = self._frontend()
        dt = {"float32": fe.data_type.FLOAT, "float16": fe.data_type.HALF, "bfloat16": fe.data_type.BFLOAT16}[problem.dtype]
        g = fe.pygraph(io_data_type=dt, intermediate_data_type=fe.data_type.FLOAT,
                       compute_data_type=fe.data_type.FLOAT, handle=self._handle() if handle is None else handle)
        lay = tensor_layout(problem)
        ra, rb, ro = ROLES[op]
        a = g.tensor(dim=lay[ra][0], stride=lay[ra][1], data_type=dt, name=ra, uid=UIDS[0])
        b = g.tensor(dim=lay[rb][0], stride=lay[rb][1], data_type=dt, name=rb, uid=UIDS[1])
        conv = dict(padding=list(problem.pad), stride=list(problem.stride), dilation=list(problem.dilation),
                    compute_data_type=fe.data_type.FLOAT)
        if op == "forward":
            out = g.conv_fprop(a, b, **conv)
        elif op == "backward_data":
            out = g.conv_dgrad(b, a, **conv)       # (loss dy, filter w)
        elif op == "backward_filter":
            out = g.conv_wgrad(a, b, **conv)       # (image x, loss dy)
        else:
            raise InputError(f"unknown op {op!r}", "op")
        out.set_output(True)
        out.set_dim(lay[ro][0])
        out.set_stride(lay[ro][1])
        out.set_data_type(dt)
        out.set_uid(UIDS[2])
        g.validate()
        g.build_operation_graph()
        return g

    def _heuristics(self, g: Any, modes: Sequence[str] | None = None) -> None:
        fe = self._frontend()
        g.create_execution_plans([getattr(fe.heur_mode, m) for m in (self.modes if modes is None else modes)])

    def _knob_types(self) -> dict[int, Any]:
        """cudnnBackendKnobType_t number -> the frontend's ``knob_type`` member, for the knobs the frontend names
        (``create_execution_plan`` takes its own enum; a tag holds backend numbers)."""
        if self._knobs is None:
            kt = getattr(self._frontend(), "knob_type", None)
            self._knobs = {n: getattr(kt, name) for n, name in enumerate(BACKEND_KNOBS)
                           if name and kt is not None and hasattr(kt, name)}
        return self._knobs

    def _from_identity(self, op: str, problem: ConvProblem, ident: EngineIdentity,
                       cap: int | None = None) -> tuple[Any, int] | str | None:
        """A graph holding ``ident`` alone, made from its engine id and knobs (``create_execution_plan``: no
        heuristics query) and built: (graph, workspace bytes); a refusal's reason (it does not build here); or None:
        it cannot be made so (a knob the frontend does not name, no ``create_execution_plan``, or the plan made is
        another configuration)."""
        knobs = self._knob_types()
        if any(k not in knobs for k, _ in ident.knobs):
            return None
        try:
            g = self.graph(op, problem)
            if not hasattr(g, "create_execution_plan"):
                return None
            g.create_execution_plan(ident.engine_id, {knobs[k]: v for k, v in ident.knobs})
            if EngineIdentity.parse_tag(g.get_plan_name_at_index(0)) != ident:
                return None
            if cap is not None:
                g.deselect_workspace_greater_than(int(cap))
        except Exception:  # noqa: BLE001 - cannot be made from its identity
            return None
        try:
            g.build_plan_at_index(0)
        except Exception as e:  # noqa: BLE001
            return classify_failure(str(e))
        return g, int(g.get_workspace_size_plan_at_index(0))

    # -- the configurations to time: CPU only, possibly prepared ahead (overlap) ----------------------
    def _candidates(self, op: str, problem: ConvProblem, numerics: str, excluded: tuple[str, ...],
                    cap: int, full: bool = False) -> "_Candidates":
        """The heuristics' configurations at ``problem.n`` under the numerics filter and workspace ``cap``, built in
        heuristic order (``top_k``: the first k that build), with their engines' numerical notes.  Host work only
        (no GPU call beyond plan builds), so it may run on the overlap helper (:meth:`prefetch`).

        List reuse (``reuse_lists``, issue 16): where the previous size's list of the same kernel was complete (every
        configuration it admitted built, none cut by ``top_k``), only the cheap heuristic modes are asked (all but
        ``B``, whose query was 78% of the heuristics' host time on AlexNet b256 FP32 strict: 3.6 of 4.6 s), and every
        configuration the previous size admitted that they do not list is made from its identity
        (:meth:`_from_identity`).  Why: on AlexNet FP32 strict the admitted configurations are the same at every
        size, and mode B's own (the fastest large-workspace engines) were each admitted at the next smaller size
        too (``benchmarks/results/bench_time-*``).  ``full`` (or a configuration that cannot be made so, or more
        than ``top_k``): every mode, as without reuse.  A truncated list (FP16 NHWC: the 12 of dozens) is never
        reused: its order decides which 12."""
        fe = self._frontend()
        mb = problem.n
        skipped: list[Skipped] = []
        list_key = (self._device(), op, problem.with_batch(1), numerics, int(cap))
        cheap = tuple(m for m in self.modes if m != "B")
        prev = None if full or not self.reuse_lists or cheap == self.modes or not cheap else self._lists.get(list_key)
        reuse = prev is not None and prev[0] and prev[1] < mb   # complete, at a smaller size of this benchmark
        t0 = time.perf_counter()
        try:
            g = self.graph(op, problem)
            self._heuristics(g, cheap if reuse else None)
        except Exception as e:  # noqa: BLE001 - the frontend raises its own types; nothing escapes measure()
            why = f"graph: no engine configuration: {_first_line(e)}"
            return _Candidates(None, [], {}, [Skipped(mb, None, None, why)])
        if excluded:
            g.deselect_numeric_notes([getattr(fe.numerical_note, n) for n in excluded])
        g.deselect_workspace_greater_than(int(cap))
        self.stats["heuristics_s"] += time.perf_counter() - t0

        # build, in heuristic order, each distinct configuration (top_k: the first k that build)
        count = g.get_execution_plan_count()
        seen: set[str] = set()
        built: list[tuple[int, EngineIdentity, int, list[str], float, int]] = []
        plans: dict[EngineIdentity, _Built] = {}
        rank = -1
        complete = True
        for i in range(count):
            name = g.get_plan_name_at_index(i)
            try:
                ident = EngineIdentity.parse_tag(name)
            except InputError:
                skipped.append(Skipped(mb, name, None, "graph: unreadable engine name"))
                continue
            if ident.tag in seen:
                continue
            seen.add(ident.tag)
            rank += 1
            if self.top_k is not None and len(built) >= self.top_k:
                self.stats["configs_pruned"] += 1
                complete = False
                continue
            behavior = [_name(b) for b in g.get_behavior_notes_for_plan_at_index(i)]
            if "RUNTIME_COMPILATION" in behavior and not self.runtime_compiled:
                skipped.append(Skipped(mb, ident.tag, None, "runtime-compiled engine (not built by default)"))
                continue
            t1 = time.perf_counter()
            try:
                g.build_plan_at_index(i)
            except Exception as e:  # noqa: BLE001
                skipped.append(Skipped(mb, ident.tag, None, classify_failure(str(e))))
                continue
            build_ms = (time.perf_counter() - t1) * 1e3
            self.stats["build_s"] += build_ms / 1e3
            self.stats["configs_built"] += 1
            eng_ws = int(g.get_workspace_size_plan_at_index(i))
            built.append((i, ident, eng_ws, behavior, build_ms, rank))
            plans[ident] = _Built(g, i, eng_ws)
        if reuse:   # the previous size's admitted configurations the cheap modes did not list
            carried = [(ident, behavior) for ident, behavior in prev[2] if ident.tag not in seen]
            if self.top_k is not None and len(built) + len(carried) > self.top_k:
                return self._candidates(op, problem, numerics, excluded, cap, full=True)
            for ident, behavior in carried:
                t1 = time.perf_counter()
                got = self._from_identity(op, problem, ident, cap)
                if got is None:
                    return self._candidates(op, problem, numerics, excluded, cap, full=True)
                rank += 1
                if isinstance(got, str):
                    skipped.append(Skipped(mb, ident.tag, None, got))
                    continue
                build_ms = (time.perf_counter() - t1) * 1e3
                self.stats["build_s"] += build_ms / 1e3
                self.stats["configs_built"] += 1
                self.stats["configs_carried"] += 1
                built.append((-1 - len(built), ident, got[1], behavior, build_ms, rank))
                plans[ident] = _Built(got[0], 0, got[1])
        self.stats["lists_reused" if reuse else "lists_full"] += 1
        self._lists[list_key] = (complete, mb, [(b[1], b[3]) for b in built])
        if not built:
            return _Candidates(g, [], {}, skipped)
        notes = self._engine_notes(op, problem, g, numerics, [b[1].engine_id for b in built], count)
        return _Candidates(g, built, notes, skipped, plans)

    def start_benchmark(self) -> None:
        """A benchmark begins (:func:`ucudnn.measure.benchmark`): lists are reused within one benchmark only."""
        self._lists.clear()

    def _candidates_key(self, op: str, problem: ConvProblem, numerics: str, cap: int) -> tuple:
        return ("graph", id(self), self._device(), op, problem, numerics, int(cap))

    def prefetch(self, op: str, problem: ConvProblem, settings: BenchSettings) -> bool:
        """Queue the preparation of ``problem``'s configurations (:meth:`_candidates`) on the overlap helper
        (:mod:`.overlap`), to be taken by :meth:`measure`; False when nothing was queued (no benchmark active,
        ``prefetch`` off, the frontend unavailable, already queued)."""
        from .overlap import OVERLAP

        if not self.prefetching or not OVERLAP.active:
            return False
        try:
            self._frontend()
        except GraphUnavailable:
            return False
        numerics = num.normalize(settings.numerics, problem.dtype)
        excluded = excluded_notes(numerics, problem.dtype)
        scratch = scratch_bytes(op, problem)
        cap = settings.max_workspace - (scratch + 256 if scratch else 0)
        if cap < 0:
            return False
        device = self._device()

        def job() -> _Candidates:
            try:
                from cupy.cuda import Device
            except Exception:  # noqa: BLE001 - no CuPy (fakes): one device
                return self._candidates(op, problem, numerics, excluded, cap)
            with Device(device):
                return self._candidates(op, problem, numerics, excluded, cap)

        return OVERLAP.submit(self._candidates_key(op, problem, numerics, cap), job)

    def _taken(self, op: str, problem: ConvProblem, numerics: str, excluded: tuple[str, ...],
               cap: int) -> "_Candidates":
        """:meth:`_candidates`, from the overlap helper where :meth:`prefetch` queued it and it ran, else now."""
        from .overlap import OVERLAP

        try:
            ok, got = OVERLAP.take(self._candidates_key(op, problem, numerics, cap))
        except Exception:  # noqa: BLE001 - whatever went wrong on the helper, the inline preparation decides
            ok, got = False, None
            self.stats["prefetch_errors"] += 1
        if ok:
            self.stats["prefetched"] += 1
            return got
        return self._candidates(op, problem, numerics, excluded, cap)

    # -- measurement ------------------------------------------------------------------------------
    def measure(self, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        """Every engine configuration the heuristics offer at ``problem.n``, filtered by numerics, built and timed."""
        mb = problem.n
        try:
            self._frontend()
        except GraphUnavailable as e:
            return [], [Skipped(mb, None, None, f"graph source unavailable: {e}")]
        numerics = num.normalize(settings.numerics, problem.dtype)
        excluded = excluded_notes(numerics, problem.dtype)
        scratch = scratch_bytes(op, problem)
        cap = settings.max_workspace - (scratch + 256 if scratch else 0)
        skipped: list[Skipped] = []
        if cap < 0:
            return [], [Skipped(mb, None, None, "graph: the benchmark workspace cannot hold the accumulation buffer")]
        cands = self._taken(op, problem, numerics, excluded, cap)
        skipped += cands.skipped
        if cands.graph is None or not cands.built:
            return [], skipped
        g, built, notes = cands.graph, cands.built, cands.notes
        key0 = (self._device(), op)
        for i, ident, eng_ws, *_ in built:
            self._plans[key0 + (problem, ident)] = cands.plans.get(ident) or _Built(g, i, eng_ws)

        # time: one quick sample each, then (unless dominated by the margin) the full median
        measured: list[Measurement] = []
        acc_ms = self._accumulate_cost(op, problem, ops, workspace) if scratch else None
        beta = timed_beta(op, problem)   # backward filter: time the accumulating path
        t2 = time.perf_counter()
        quick: dict[int, float] = {}
        quick_host: dict[int, float | None] = {}   # host ms per call of each quick sample (binding.timing)
        rows = []
        # split dominance before the quick sample (BenchSettings.split_margin): an engine whose time at a smaller
        # size already exceeds what WR can do here is not run at all.  Engines new at this size first, then by
        # that lower bound, so the fast ones' quick samples are references for the slow ones.
        split = settings.split_reference(problem)
        labels = {b[1].engine_id: math_type_label(notes.get(b[1].engine_id), numerics, problem.dtype) for b in built}
        if split is not None:
            def lower_bound(b: tuple) -> float:
                prev = split.previous.get((self.name, b[1].tag, labels[b[1].engine_id]))
                return -1.0 if prev is None else prev.time_ms

            built = sorted(built, key=lower_bound)
        sampled: list[tuple[float, int]] = []
        for i, ident, eng_ws, behavior, build_ms, rnk in built:
            ws = plan_workspace(eng_ws, op, problem)
            if split is not None:
                why = split.unneeded(self.name, ident.tag, labels[ident.engine_id], ws, sampled)
                if why is not None:
                    skipped.append(Skipped(mb, ident.tag, labels[ident.engine_id], why))
                    self.stats["configs_split_skipped"] += 1
                    continue

            def near(ms: float, ws: int = ws) -> bool:   # within NEAR_TIE of WR's best here: the split or a row
                if split is None:
                    return False
                ref = min(split.split_ms(ws), split.reference(ws, sampled)[0])
                return ref / NEAR_TIE < ms < ref * NEAR_TIE

            cfg = self._config(mb, ident, ws)
            fn = self._runner(op, problem, cfg, ops, workspace, ws, beta)
            tq = time.perf_counter()
            try:
                with HostRecorder() as host:
                    quick[i] = self._quick(fn, settings, key0 + (ident.tag,), near)
                quick_host[i] = host.ms
            except Exception as e:  # noqa: BLE001
                skipped.append(Skipped(mb, ident.tag, None, f"graph execution failed: {_first_line(e)}"))
                continue
            rows.append((i, ident, eng_ws, ws, behavior, build_ms + (time.perf_counter() - tq) * 1e3, build_ms,
                         rnk, fn))
            sampled.append((quick[i], ws))
        margin = self.quick_margin if self.quick_margin is not None else settings.prune_margin
        pruner = Pruner(settings)
        for i, ident, eng_ws, ws, behavior, cost_ms, build_ms, rnk, fn in sorted(rows, key=lambda r: quick[r[0]]):
            pruned = dominated(quick[i], ws, [(quick[j], ws_j) for j, _, _, ws_j, *_ in rows if j != i], margin)
            pruned = pruned or settings.budget_spent() or pruner.hopeless(quick[i], ws) or settings.trusts(quick[i])
            # split dominance after the quick sample: no median for an engine WR would not choose
            split_dominated = not pruned and split is not None and split.dominates(quick[i], ws)
            pruned = pruned or split_dominated
            t = quick[i]
            timing = "quick"
            host_ms = quick_host.get(i)
            if settings.repeat > 0 and not pruned:
                tf = time.perf_counter()
                try:
                    with HostRecorder() as host:
                        t = pruner.confirm(lambda: time_config(fn, settings, self._timer), quick[i],
                                           time_config(fn, settings, self._timer))
                    host_ms = host.ms if host.ms is not None else host_ms
                    timing = "median"
                except Exception as e:  # noqa: BLE001
                    skipped.append(Skipped(mb, ident.tag, None, f"graph execution failed: {_first_line(e)}"))
                    continue
                cost_ms += (time.perf_counter() - tf) * 1e3
                pruner.record(quick[i], ws, t, "median")
            self.stats["configs_timed" if timing == "median" else "configs_quick_only"] += 1
            self.stats["configs_split_quick"] += split_dominated
            eng_notes = notes.get(ident.engine_id)
            extra: dict[str, Any] = {"heuristic_rank": rnk, "build_ms": round(build_ms, 3),
                                     "quick_ms": round(quick[i], 6), "timing": timing, "bench_ms": round(cost_ms, 3),
                                     "engine_workspace_bytes": eng_ws}
            if split_dominated:
                extra["pruned"] = "split-dominated"
            if eng_notes is not None:
                extra["notes"] = sorted(eng_notes)
                extra["deterministic"] = "NONDETERMINISTIC" not in eng_notes
            elif "NONDETERMINISTIC" in excluded:
                extra["deterministic"] = True
            if behavior:
                extra["behavior_notes"] = behavior
            if acc_ms is not None:
                extra["accumulate_ms"] = round(acc_ms, 6)
            if settings.timing != "replay":   # its quick samples time eagerly even then: not the plan's host work
                extra.update(host_extra(host_ms))
            measured.append(Measurement(mb, ident.tag, math_type_label(eng_notes, numerics, problem.dtype),
                                        max(t, 1e-6), ws, self.name, ident.to_json(), extra))
        self.stats["time_s"] += time.perf_counter() - t2
        self.stats["configs_confirmed"] += pruner.counts.get("confirmed", 0)
        measured.sort(key=lambda m: m.extra["heuristic_rank"])   # timed fastest first, reported in heuristic order
        return measured, skipped

    @staticmethod
    def _config(mb: int, ident: EngineIdentity, ws: int) -> Measurement:
        return Measurement(mb, ident.tag, "", 1.0, ws, "graph", ident.to_json())

    def _runner(self, op: str, problem: ConvProblem, cfg: Measurement, ops: Operands, workspace: int,
                ws: int, beta: float) -> Callable[[], None]:
        launch = self.prepare(op, problem, cfg)
        return lambda: launch(ops, workspace, ws, 1.0, beta)

    def _engine_notes(self, op: str, problem: ConvProblem, g: Any, numerics: str, engine_ids: list[int],
                      count: int) -> dict[int, frozenset[str] | None]:
        """Numerical notes per engine id: fixed by the filter, probed (cached) for the rest (module doc)."""
        base_key = (op, problem.with_batch(1), numerics)
        want = [e for e in dict.fromkeys(engine_ids) if base_key + (e,) not in self._notes]
        if want:
            t0 = time.perf_counter()
            probed = self._probe(op, problem, g, numerics, want, count)
            for e in want:
                self._notes[base_key + (e,)] = probed.get(e)
            self.stats["probe_s"] += time.perf_counter() - t0
        return {e: self._notes[base_key + (e,)] for e in engine_ids}

    def _probe(self, op: str, problem: ConvProblem, g: Any, numerics: str, engine_ids: list[int],
               count: int) -> dict[int, frozenset[str] | None]:
        """Each engine's notes among :func:`probed_notes`: one engine per probe graph where the frontend builds a
        plan from an engine id (:meth:`_probe_engines`), else, and for any engine that left unanswered, through
        probe graphs lined up with ``g``'s heuristics list (:meth:`_probe_listed`)."""
        out: dict[int, frozenset[str] | None] = {}
        rest = list(engine_ids)
        if self.fast_probe and hasattr(g, "create_execution_plan"):
            out = {e: v for e, v in self._probe_engines(op, problem, numerics, rest).items() if v is not None}
            rest = [e for e in rest if e not in out]
        if rest:
            out.update(self._probe_listed(op, problem, g, numerics, rest, count))
        return out

    def _probe_engines(self, op: str, problem: ConvProblem, numerics: str,
                       engine_ids: list[int]) -> dict[int, frozenset[str] | None]:
        """Notes per engine from probe graphs holding that engine alone (``create_execution_plan(id, {})``: no
        heuristics query, which is what a lined-up probe costs: 39 ms a graph on AlexNet FP16 NHWC, four graphs a
        probe, 6.1 of the benchmark's 33 s).  Numerical notes are the engine's (``CUDNN_ATTR_ENGINE_NUMERICAL_NOTE``,
        read through the engine of the configuration), so the engine's default knobs tell the same as the
        heuristics' ones; the filter and the refusal are the frontend's, as in :meth:`_probe_listed`.  One engine
        per graph: the frontend re-reads every configuration's notes on each ``create_execution_plan`` and
        appends them, so a second engine in one graph would be read against the first one's notes.  None for an
        engine the probe cannot tell (the frontend refused to create it, or built it)."""
        fe = self._frontend()
        notes = probed_notes(numerics, problem.dtype)
        out: dict[int, frozenset[str] | None] = {}
        for e in engine_ids:
            has: set[str] = set()
            known = True
            for note in notes:
                try:
                    p = self.graph(op, problem)
                    p.create_execution_plan(e, {})
                    p.select_numeric_notes([getattr(fe.numerical_note, note)])
                    p.deselect_workspace_greater_than(-1)   # refuse everything that passes the note filter
                except Exception:  # noqa: BLE001
                    known = False
                    break
                self.stats["probe_graphs"] += 1
                try:
                    p.build_plan_at_index(0)
                    known = False   # built: the workspace refusal did not happen; cannot tell
                    break
                except Exception as ex:  # noqa: BLE001
                    msg = str(ex)
                    if "workspace violation" in msg:
                        has.add(note)
                    elif "Deselecting execution plan" not in msg:
                        known = False
                        break
            out[e] = frozenset(has) if known else None
        return out

    def _probe_listed(self, op: str, problem: ConvProblem, g: Any, numerics: str, engine_ids: list[int],
                      count: int) -> dict[int, frozenset[str] | None]:
        """Notes per engine from one probe graph per note, built through the same heuristics as ``g`` and lined up
        with its list (module doc); None for every engine when the lists differ."""
        fe = self._frontend()
        names = [g.get_plan_name_at_index(i) for i in range(count)]
        first: dict[int, int] = {}
        for i, nm in enumerate(names):
            m = _TAG.match(nm)
            if m and int(m.group(1)) in engine_ids:
                first.setdefault(int(m.group(1)), i)
        has: dict[int, set[str]] = {e: set() for e in engine_ids}
        unknown: set[int] = {e for e in engine_ids if e not in first}
        for note in probed_notes(numerics, problem.dtype):
            try:
                p = self.graph(op, problem)
                self.stats["probe_graphs"] += 1
                self._heuristics(p)
                if [p.get_plan_name_at_index(i) for i in range(p.get_execution_plan_count())] != names:
                    unknown |= set(first)   # a different list: cannot line the probe up; say nothing
                    break
                p.select_numeric_notes([getattr(fe.numerical_note, note)])
                p.deselect_workspace_greater_than(-1)   # refuse everything that passes the note filter
            except Exception:  # noqa: BLE001
                unknown |= set(first)
                break
            for e, i in first.items():
                try:
                    p.build_plan_at_index(i)
                    unknown.add(e)   # built: the workspace refusal did not happen; cannot tell
                except Exception as ex:  # noqa: BLE001
                    msg = str(ex)
                    if "workspace violation" in msg:
                        has[e].add(note)
                    elif "Deselecting execution plan" not in msg:
                        unknown.add(e)
        return {e: (None if e in unknown else frozenset(has[e])) for e in engine_ids}

    def _accumulate_cost(self, op: str, problem: ConvProblem, ops: Operands, workspace: int) -> float | None:
        """ms of adding one filter gradient into another (what explicit accumulation adds per micro-batch; for
        a channel slice's backward data, one dx micro-batch into another, which depends on the micro-batch)."""
        key = problem if op == "backward_data" else problem.with_batch(1)
        if key in self._accumulate_ms:
            return self._accumulate_ms[key]
        try:
            t = self._time(lambda: self._blend(op, problem, workspace, ops.out, 1.0, 1.0),
                           repeat=5, warmup=1, min_sample_ms=1.0)
        except Exception:  # noqa: BLE001
            return None
        self._accumulate_ms[key] = t
        return t

    # -- execution --------------------------------------------------------------------------------
    def plan_for(self, op: str, problem: ConvProblem, ident: EngineIdentity) -> _Built:
        """The built plan of ``ident`` at ``problem.n``: cached, else rebuilt from the heuristics list."""
        key = (self._device(), op, problem, ident)
        built = self._plans.get(key)
        if built is not None:
            return built
        with self._lock:
            built = self._plans.get(key)
            if built is None:
                built = self._plans[key] = self._rebuild(op, problem, ident)
        return built

    def _rebuild(self, op: str, problem: ConvProblem, ident: EngineIdentity) -> _Built:
        g = self.graph(op, problem)
        self._heuristics(g)
        for i in range(g.get_execution_plan_count()):
            try:
                if EngineIdentity.parse_tag(g.get_plan_name_at_index(i)) != ident:
                    continue
            except InputError:
                continue
            try:
                g.build_plan_at_index(i)
            except Exception as e:  # noqa: BLE001
                raise CudnnError("graph build_plan_at_index", -1, "GRAPH_PLAN_BUILD_FAILED",
                                 f"{ident.tag} at n={problem.n}: {_first_line(e)}") from None
            return _Built(g, i, int(g.get_workspace_size_plan_at_index(i)))
        got = self._from_identity(op, problem, ident)   # e.g. measured as a reused list's carried configuration
        if isinstance(got, tuple):
            return _Built(got[0], 0, got[1])
        raise CudnnError("graph heuristics", -1, "GRAPH_ENGINE_NOT_FOUND",
                         f"{ident.tag} is not among the heuristics' configurations for {op} at n={problem.n} "
                         "(a table from another cuDNN version or device?)")

    def twin(self, op: str, problem: ConvProblem, engine_ids: Sequence[int], workspace_bytes: int,
             deterministic: bool = True) -> Measurement | None:
        """The graph-API configuration that runs what a legacy algorithm runs (its *twin*), built and kept for
        :meth:`prepare`, or None.

        Why: cuDNN 9 runs its legacy API on the graph API's engines; a legacy call finalizes the engine
        configuration again on every call, which costs the host 20-60 us more than executing a plan built once
        (``benchmarks/legacy_twins.py``, H200: FFT_TILING forward 70 vs 43 us, WINOGRAD_NONFUSED forward 82 vs 24).
        ``engine_ids``: the engines cuDNN's own log shows the legacy algorithm running as
        (:data:`~ucudnn.legacy_engines.TWIN_ENGINES`), tried in order with their default knobs; one is the
        twin when it builds with no tensor-core, down-converting or reduced-precision notes (nor a
        nondeterministic one where the legacy row was deterministic) and needs exactly ``workspace_bytes``, the
        legacy algorithm's own workspace at this problem (the check that it is the same algorithm)."""
        key = (self._device(), op, problem, tuple(engine_ids), int(workspace_bytes), bool(deterministic))
        with self._lock:
            if key not in self._twins:
                self._twins[key] = self._find_twin(key[0], op, problem, engine_ids, workspace_bytes, deterministic)
            return self._twins[key]

    def _find_twin(self, device: int, op: str, problem: ConvProblem, engine_ids: Sequence[int],
                   workspace_bytes: int, deterministic: bool) -> Measurement | None:
        try:
            fe = self._frontend()
        except GraphUnavailable:
            return None
        # strict numerics' filter (the twin's math is no looser than the legacy call's FMA)
        excluded = excluded_notes("strict-deterministic" if deterministic else "strict", problem.dtype)
        for e in engine_ids:
            try:
                g = self.graph(op, problem)
                g.create_execution_plan(int(e), {})
                ident = EngineIdentity.parse_tag(g.get_plan_name_at_index(0))
                g.deselect_numeric_notes([getattr(fe.numerical_note, n) for n in excluded])
                g.build_plan_at_index(0)
                ws = int(g.get_workspace_size_plan_at_index(0))
            except Exception:  # noqa: BLE001 - not this problem's engine, or refused by its notes
                continue
            if ws == workspace_bytes and ident.engine_id == int(e):
                self._plans[(device, op, problem, ident)] = _Built(g, 0, ws)
                return self._config(problem.n, ident, ws)
        return None

    def prepare(self, op: str, problem: ConvProblem, config: Any) -> Launch:
        """The configuration's engine plan, built (or found built) now; the launcher executes it.

        The common case (aligned operands, alpha 1, beta 0) is kept short: on
        small kernels the host's per-call work competes with the GPU's.  A
        launcher called on another device than it was prepared on finds (or
        builds) that device's plan.
        """
        ident = EngineIdentity.from_json(config.engine if config.engine is not None else config.algo)
        device = self._device()
        built = self.plan_for(op, problem, ident)
        device_now = self._device
        nbytes = tuple(_bytes(role, problem) for role in ROLES[op])

        def launch(ops: Operands, workspace: int, workspace_bytes: int, alpha: float, beta: float) -> None:
            plan = built if device_now() == device else self.plan_for(op, problem, ident)
            if workspace_bytes < plan.engine_bytes:
                raise UcudnnError(f"graph engine {ident.tag} needs {plan.engine_bytes} bytes of workspace, "
                                  f"got {workspace_bytes}")
            if alpha == 1.0 and beta == 0.0 and not (ops.a | ops.b | ops.out) % ALIGNMENT:
                self._execute(plan, ops.a, ops.b, ops.out, workspace)
            else:
                self._run_staged(op, problem, plan, nbytes, ops, workspace, workspace_bytes, alpha, beta)

        launch.direct = _direct(built, device, ident)  # type: ignore[attr-defined]
        launch.native = Native(  # type: ignore[attr-defined]
            "graph", op, problem, engine_id=ident.engine_id, knobs=ident.knobs, engine_bytes=built.engine_bytes)
        return launch

    def _run_staged(self, op: str, problem: ConvProblem, built: _Built, nbytes: tuple[int, int, int],
                    ops: Operands, workspace: int, workspace_bytes: int, alpha: float, beta: float) -> None:
        """Misaligned operands or a blend (module doc: scratch, staging); ``nbytes``: sizes of (a, b, out).

        The caller has checked that the workspace holds the engine's own."""
        from ...planning.arena import align_up

        a, b = ops.a, ops.b
        temps: list[Any] = []
        if a % ALIGNMENT or b % ALIGNMENT:
            a = self._staged(a, nbytes[0], temps)
            b = self._staged(b, nbytes[1], temps)
        out_bytes = nbytes[2]
        if workspace_bytes >= align_up(built.engine_bytes) + out_bytes:
            scratch = workspace + align_up(built.engine_bytes)
        else:  # forward / backward data with a caller's alpha, beta: not planned for; borrow from CuPy's pool
            scratch = self._temp(out_bytes, temps)
        self._execute(built, a, b, scratch, workspace)
        self._blend(op, problem, scratch, ops.out, alpha, beta)

    def _execute(self, built: _Built, a: int, b: int, out: int, workspace: int) -> None:
        try:
            built.graph.execute_plan_at_index({UIDS[0]: a, UIDS[1]: b, UIDS[2]: out}, workspace, built.index,
                                              handle=self._handle())
        except Exception as e:  # noqa: BLE001
            raise CudnnError("graph execute_plan_at_index", -1, "GRAPH_EXECUTION_FAILED", _first_line(e)) from None

    def _blend(self, op: str, problem: ConvProblem, src: int, dst: int, alpha: float, beta: float) -> None:
        if self._blend_fn is not None:
            return self._blend_fn(op, problem, src, dst, alpha, beta)
        from ...binding import cudnn

        desc = _output_descriptor(op, problem)
        cudnn.transform_tensor(self._handle(), alpha, desc, src, beta, desc, dst)

    def _temp(self, nbytes: int, keep: list[Any]) -> int:
        import cupy as cp

        mem = cp.cuda.alloc(max(nbytes, 1))
        keep.append(mem)   # freed back to CuPy's pool when the call returns; stream-ordered reuse is safe
        return int(mem.ptr)

    def _staged(self, ptr: int, nbytes: int, keep: list[Any]) -> int:
        if ptr % ALIGNMENT == 0:
            return ptr
        import cupy as cp

        dst = self._temp(nbytes, keep)
        cp.cuda.runtime.memcpyAsync(dst, ptr, nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
                                    cp.cuda.get_current_stream().ptr)
        return dst


def _bytes(role: str, problem: ConvProblem) -> int:
    from math import prod

    from ...problem import DTYPE_BYTES

    if role == "y" and problem.k_total is not None:   # a view: its extent, from its first to its last element
        dims, strides = tensor_layout(problem)["y"]
        return (1 + sum((d - 1) * st for d, st in zip(dims, strides))) * DTYPE_BYTES[problem.dtype]
    return prod(problem.shape(role)) * DTYPE_BYTES[problem.dtype]


@lru_cache(maxsize=1024)
def _output_descriptor(op: str, problem: ConvProblem) -> int:
    """The legacy descriptor of ``op``'s output at ``problem.n`` (cached: every accumulating step blends)."""
    role = ROLES[op][2]
    if role == "y" and problem.k_total is not None:   # a channel slice of y: the view's own strides
        from ...binding import cudnn

        d = cudnn.create_tensor_descriptor()
        cudnn.set_tensor_4d_descriptor_ex(d, problem.dtype, problem.n, problem.k, problem.p, problem.q,
                                          problem.y_strides())
        return d
    return _tensor_descriptor(problem.layout, problem.dtype, tuple(tensor_layout(problem)[role][0]))


@lru_cache(maxsize=1024)
def _tensor_descriptor(layout: str, dtype: str, dims: tuple[int, int, int, int]) -> int:
    """A legacy 4-d tensor descriptor of ``dims`` (N,C,H,W order) for cudnnTransformTensor (cached, never freed)."""
    from ...binding import cudnn

    d = cudnn.create_tensor_descriptor()
    cudnn.set_tensor_4d_descriptor(d, layout, dtype, *dims)
    return d


def _name(enum_value: Any) -> str:
    return getattr(enum_value, "name", str(enum_value).rsplit(".", 1)[-1])


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:200]


def _direct(built: _Built, device: int, ident: "EngineIdentity") -> Any:
    """The :data:`~.base.Direct` shortcut of one built engine plan: the frontend's own execute (its C++ binding,
    not the Python wrapper that rebuilds the pointer map) with the handle bound to the caller's stream."""
    from ...binding.gpu import current_device, handle_on

    execute = getattr(built.graph, "_execute_plan_at_index", None)
    if execute is None:     # a graph object without the frontend's binding (a test's stand-in)
        return None
    index, need = built.index, built.engine_bytes
    a_uid, b_uid, out_uid = UIDS

    def direct(pa: int, pb: int, po: int, workspace: int, workspace_bytes: int, stream: int) -> bool:
        if (pa | pb | po) % ALIGNMENT or workspace_bytes < need or current_device() != device:
            return False
        try:
            execute({a_uid: pa, b_uid: pb, out_uid: po}, workspace, index, handle_on(stream, device), None, None,
                    None)
        except Exception as e:  # noqa: BLE001
            raise CudnnError("graph execute_plan_at_index", -1, "GRAPH_EXECUTION_FAILED",
                             f"{ident.tag}: {_first_line(e)}") from None
        return True

    return direct
