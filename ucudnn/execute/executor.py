"""Executing a kernel plan on CuPy arrays.

Forward and backward-data split along N: micro-batch i reads and writes the
i-th slice of the batched tensors (a prefix pointer offset; slices along N are
contiguous in NCHW and NHWC).  Backward-filter accumulates: the first
micro-batch applies the caller's ``beta``, the rest ``beta = 1`` so the filter
gradient sums over the whole mini-batch; ``alpha`` applies to each.  All
micro-batches share one workspace buffer of the plan's size.

Unwritten memory (issue 18, :func:`ucudnn.planning.wr.solve_with_unwritten`): a step whose configuration says
``workspace_from: unwritten`` takes its workspace from memory the call owns but has not written yet, not from the
workspace buffer: forward and backward data, the output of the samples after its micro-batch (the steps run in
order, so that output is written later; it needs ``beta = 0``); backward filter, the layer's dx, which the caller
passes before its backward data writes it (``unwritten=``).  The executor's :attr:`workspace_bytes` leaves such
steps out.

Channel slices (issue 18, :mod:`ucudnn.planning.channels`): a step of a slice
of c output channels starting at k0 reads and writes views: w (dw) from filter
k0, y (dy) from channel k0 of each sample with the whole tensor's strides.
Backward-filter accumulates within a slice; backward-data adds each slice's
contribution into dx (the first slice applies the caller's beta).

``Executor(plan, replay=True)`` captures a call's steps into a CUDA graph the
first time it sees its buffers (pointers, scalars, workspace) and replays
that graph on later calls with the same ones.  Why: a plan of many small
micro-batches can be bound by the host's launch work.  Measured on an H100
(AlexNet conv2, fp32, relayout via NCHW Winograd, 12 samples): 165 us of host
work per step for 104 us of GPU work.  Training loops and servers call a
kernel with the same buffers again and again, so they get the GPU time
without writing any capture code.  A call that cannot be captured runs
eagerly and is never tried again (``replay_failures`` says why).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..binding import cudnn
from ..binding.gpu import capture, cupy, cupy_dtype, descriptors, handle
from ..errors import InputError, UcudnnError, summary
from ..measure.sources import registry
from ..measure.sources.base import Launch, Native, Operands, direct_of, native_of
from ..planning.channels import steps as channel_steps
from ..planning.plan import KernelPlan, Plan
from ..planning.wr import UNWRITTEN_ALIGN
from ..problem import ROLES


class NativeStep(NamedTuple):
    """One step of a plan as a compiled launch path runs it (``ucudnn.torch``'s, :attr:`Executor.native_steps`)."""

    native: Native                  # its configuration, described by its source
    shifts: tuple[int, int, int]    # bytes from the start of (a, b, out) to this step's slices
    accumulate: bool = False        # adds into what earlier steps wrote (beta = 1)
    #: where its workspace starts, in bytes from the start of the output (rounded up to
    #: :data:`~ucudnn.planning.wr.UNWRITTEN_ALIGN`, running to the output's end: the later samples' output, not
    #: written yet), for a backward filter from the start of the buffer its caller lends (the layer's dx), or -1:
    #: the call's workspace buffer
    from_out: int = -1
    need: int = 0                   # bytes of workspace it needs (what the buffer or the output's tail must hold)


@dataclass
class _Step:
    micro_batch: int
    offset: int            # first sample of this micro-batch
    config: Any            # MicroConfig
    workspace_bytes: int   # what cuDNN says this step needs now
    launch: Launch         # the configuration prepared by its source
    shifts: tuple[int, int, int]   # bytes from the start of (a, b, out) to this micro-batch's slice
    accumulate: bool = False       # adds into what earlier steps wrote (beta = 1) instead of the caller's beta
    unwritten: bool = False        # its workspace is memory the call has not written yet (the module's doc)
    #: forward / backward data on unwritten memory: bytes from the start of the output to the first sample after
    #: its micro-batch, where its workspace starts (rounded up to UNWRITTEN_ALIGN); a backward filter's: 0 (the
    #: start of the dx its caller lends); -1 otherwise
    from_out: int = -1


class Executor:
    """A kernel plan made ready to run: every step prepared by its source, workspace needs checked once.

    Construction does the per-configuration work (descriptors, graph-API plan
    builds), so a call is only pointer arithmetic and one launcher per
    micro-batch: create an Executor once per plan and device, call it often.
    """

    #: captured calls kept per executor (least recently used dropped): one per distinct set of buffers.  Executors
    #: are shared by every layer of one shape (ResNet-50 has up to 6 per shape and op in a training step, each with
    #: its own buffers), so a small cache re-captures on every call (measured: a replayed ResNet-50 AMP step took
    #: 84.5 ms of host time against 53.2 eager with 8)
    MAX_GRAPHS = 64

    def __init__(self, plan: KernelPlan, *, replay: bool = False):
        self.plan = plan
        p, op = plan.problem, plan.op
        self._dtype = cupy_dtype(p.dtype)
        self._expect = [(role, p.shape(role)) for role in ROLES[op]]
        item = self._dtype.itemsize
        per_sample = {r: math.prod(p.shape(r)[1:]) * item for r in ("x", "y")}
        # a channel slice starts k0 filters into w (dw) and k0 channels into each sample of y (dy)
        per_channel = {"w": math.prod(p.w_shape()[1:]) * item, "y": (p.p * p.q if p.layout == "NCHW" else 1) * item}
        # bytes an output sample holds (forward: y, backward data: dx): the unit of an unwritten tail
        out_sample = per_sample["y" if op == "forward" else "x"]
        self.steps: list[_Step] = []
        for st in channel_steps(plan.configs, p.n, p.k):
            cfg = st.config
            sub = p.with_batch(cfg.micro_batch)
            if cfg.channels is not None:
                sub = sub.with_channels(st.kc, p.k)
            need = cfg.workspace_bytes
            if cfg.source == "legacy":
                d = descriptors(sub, cfg.math_type)
                a, b, out = d.operands(op)
                need = max(need, cudnn.get_workspace_size(handle(), op, a, b, d.conv, out, int(cfg.algo)))
            launch = registry.get(cfg.source).prepare(op, sub, cfg)
            shifts = tuple(st.n0 * per_sample.get(role, 0) + st.k0 * per_channel.get(role, 0) for role in ROLES[op])
            # backward filter sums over a slice's micro-batches, backward data over channel slices: the caller's
            # beta applies where a step first writes its part of the output, beta = 1 after
            accumulate = (op == "backward_filter" and not st.first_in_slice) or (
                op == "backward_data" and not st.first_slice)
            unwritten = bool(getattr(cfg, "unwritten", False))
            if unwritten and op != "backward_filter" and cfg.channels is not None:
                raise UcudnnError(f"kernel {plan.name!r}: a channel slice cannot take its workspace from the "
                                  "output of later samples (it writes every sample's rows of its channels)")
            from_out = -1
            if unwritten:
                from_out = 0 if op == "backward_filter" else (st.n0 + cfg.micro_batch) * out_sample
            self.steps.append(_Step(cfg.micro_batch, st.n0, cfg, need, launch, shifts,  # type: ignore[arg-type]
                                    accumulate, unwritten, from_out))
        self._out_bytes = p.n * out_sample   # the output's size: where an unwritten tail ends
        self.workspace_bytes = max((s.workspace_bytes for s in self.steps if not s.unwritten), default=0)
        self.takes_unwritten = any(s.unwritten for s in self.steps)
        self.replay = replay
        only = self.steps[0] if len(self.steps) == 1 else None
        #: the one-step plan's :data:`~ucudnn.measure.sources.base.Direct` shortcut (its source's, when it has one):
        #: ``direct(a, b, out, workspace, workspace_bytes, stream) -> bool`` runs the plan with alpha 1 and beta 0
        #: on ``stream`` with no CuPy context; None for plans of several steps, replayed plans and sources with
        #: no shortcut (``launch`` runs those)
        self.direct = direct_of(only.launch) if (only is not None and not replay and not any(only.shifts)
                                                 and not only.accumulate and not only.unwritten) else None
        #: every step described as data for a compiled launch path (ucudnn.torch's): :class:`NativeStep` s, None
        #: for replayed plans and where a step has no description.  A step that accumulates says so: legacy and
        #: own-kernel launches take beta 1, a graph engine (built with beta 0) writes into scratch after its own
        #: workspace and the launch path adds that in, as the graph source's launcher does.  A backward
        #: filter's steps on unwritten memory say ``from_out`` 0: their workspace is the dx the caller lends
        self.native_steps = self._native_steps() if not replay else None
        self._own: Any = None          # the workspace allocated when the caller passes none
        self._graphs: OrderedDict[tuple, Any] = OrderedDict()
        self.replay_failures: list[str] = []

    def _native_steps(self) -> list[NativeStep] | None:
        steps = []
        for s in self.steps:
            native = native_of(s.launch)
            if native is None:
                return None
            steps.append(NativeStep(native, tuple(s.shifts), bool(s.accumulate), s.from_out, int(s.workspace_bytes)))
        return steps

    def __call__(self, a: Any, b: Any, out: Any, *, alpha: float = 1.0, beta: float = 0.0,
                 workspace: Any = None, workspace_bytes: int | None = None, unwritten: Any = None) -> Any:
        """Run the plan: ``out = alpha * op(a, b) + beta * out`` with operands in cuDNN's order (see ROLES).

        ``workspace``: a CuPy array or MemoryPointer (default: allocated from CuPy's pool).
        ``workspace_bytes``: how much of it this kernel may use (an arena segment), default all of it.
        ``unwritten``: a backward filter's layer's dx (a CuPy array), before backward data writes it, for plans
        whose steps take their workspace there (the module's doc).
        """
        for (role, shape), arr in zip(self._expect, (a, b, out)):
            if arr.shape != shape:
                raise InputError(f"{role} has shape {tuple(arr.shape)}, the plan expects {shape}", role)
            if arr.dtype != self._dtype:
                raise InputError(f"{role} has dtype {arr.dtype}, the plan expects {self.plan.problem.dtype}", role)
            if not arr.flags.c_contiguous:
                raise InputError(f"{role} must be C-contiguous ({self.plan.problem.layout})", role)
        ws_ptr, ws_size = self._workspace(workspace, workspace_bytes)
        spare = None if unwritten is None else (unwritten.data.ptr, unwritten.nbytes)
        self.launch((a.data.ptr, b.data.ptr, out.data.ptr), ws_ptr, ws_size, alpha=alpha, beta=beta, unwritten=spare)
        return out

    def launch(self, ptrs: tuple[int, int, int], workspace_ptr: int, workspace_size: int, *, alpha: float = 1.0,
               beta: float = 0.0, unwritten: tuple[int, int] | None = None) -> None:
        """Run the plan on raw device pointers ``(a, b, out)`` on CuPy's current stream, unchecked.

        For callers that own their tensors' memory and have checked shapes and
        layouts themselves (``ucudnn.torch`` passes ``data_ptr()`` of torch
        tensors, with a workspace from torch's caching allocator of at least
        :attr:`workspace_bytes`).  ``unwritten``: (pointer, bytes) of a backward filter's layer's dx.
        """
        if self.replay and not self.replay_failures:
            graph = self._graph((*ptrs, workspace_ptr, workspace_size, float(alpha), float(beta), unwritten))
            if graph is not None:
                graph.launch(cupy().cuda.get_current_stream())
                return
        self._run(ptrs, workspace_ptr, workspace_size, alpha, beta, unwritten)

    def _run(self, ptrs: tuple[int, int, int], ws_ptr: int, ws_size: int, alpha: float, beta: float,
             unwritten: tuple[int, int] | None = None) -> None:
        pa, pb, po = ptrs
        # every step's workspace first: a call refused for want of unwritten memory launches nothing
        spaces = [self._unwritten(s, po, beta, unwritten) if s.unwritten else (ws_ptr, ws_size) for s in self.steps]
        for s, (wp, wsz) in zip(self.steps, spaces):
            sa, sb, so = s.shifts
            s.launch(Operands(pa + sa, pb + sb, po + so), wp, wsz, alpha, 1.0 if s.accumulate else beta)

    def _unwritten(self, s: _Step, out_ptr: int, beta: float, given: tuple[int, int] | None) -> tuple[int, int]:
        """(pointer, bytes) of the unwritten memory step ``s`` takes as its workspace (the module's doc)."""
        name = self.plan.name
        if self.plan.op == "backward_filter":
            if given is None:
                raise UcudnnError(f"kernel {name!r}: its plan takes a backward filter's workspace from the layer's "
                                  "dx before backward data writes it; pass that buffer (unwritten=)")
            ptr, size = given
        else:
            if beta != 0.0:
                raise UcudnnError(f"kernel {name!r}: its plan takes workspace from the output of later samples, "
                                  f"which beta = {beta} says hold data; plan it without unwritten memory")
            ptr = -(-(out_ptr + s.from_out) // UNWRITTEN_ALIGN) * UNWRITTEN_ALIGN
            size = out_ptr + self._out_bytes - ptr
        if size < s.workspace_bytes:
            raise UcudnnError(f"kernel {name!r}: a step of {s.micro_batch} samples needs {s.workspace_bytes} bytes "
                              f"of unwritten memory, {max(size, 0)} are there")
        return ptr, size

    def _graph(self, key: tuple) -> Any:
        """The captured call for ``key`` (pointers, workspace, scalars): cached, else captured now; None if the
        plan cannot be captured (recorded in ``replay_failures``; the caller runs it eagerly)."""
        graph = self._graphs.get(key)
        if graph is not None:
            self._graphs.move_to_end(key)
            return graph
        ptrs, ws_ptr, ws_size, alpha, beta, unwritten = key[:3], *key[3:]
        try:   # capture records only: the replay runs on the caller's stream
            graph = capture(lambda: self._run(ptrs, ws_ptr, ws_size, alpha, beta, unwritten))
        except Exception as e:  # noqa: BLE001 - any failure inside capture means: run this plan eagerly
            self.replay_failures.append(summary(e))
            return None
        self._graphs[key] = graph
        if len(self._graphs) > self.MAX_GRAPHS:
            self._graphs.popitem(last=False)
        return graph

    def _workspace(self, workspace: Any, limit: int | None) -> tuple[int, int]:
        if self.workspace_bytes == 0:
            return 0, 0
        if workspace is None:
            if not (self.replay and self._own is not None):   # captured calls keep their pointer
                self._own = cupy().cuda.alloc(self.workspace_bytes)  # CuPy's pool makes repeated calls cheap
            return self._own.ptr, self.workspace_bytes
        if hasattr(workspace, "data"):  # an array
            ptr, size = workspace.data.ptr, workspace.nbytes
        else:  # a MemoryPointer, possibly into the middle of an allocation
            ptr, size = workspace.ptr, workspace.mem.size - (workspace.ptr - workspace.mem.ptr)
        if limit is not None:
            size = min(size, limit)
        if size < self.workspace_bytes:
            raise UcudnnError(f"kernel {self.plan.name!r}: its workspace segment has {size} bytes, "
                              f"cuDNN needs {self.workspace_bytes} for this plan")
        return ptr, size


class NetworkExecutor:
    """A whole-network plan (WD) with its workspace arena: one allocation, one segment per kernel.

    Segments are laid end to end (``ucudnn.planning.arena``), so kernels on different
    streams never share workspace; sequential kernels simply use their own slice.
    ``replay``: every kernel's executor captures and replays its calls (see :class:`Executor`).
    """

    def __init__(self, plan: Plan, *, replay: bool = False):
        from ..planning.arena import align_up

        self.plan = plan
        self.executors = {k.name: Executor(k, replay=replay) for k in plan.kernels}
        offsets = [k.offset for k in plan.kernels]
        if any(o is None for o in offsets):
            from ..planning.arena import assign_offsets

            offsets = assign_offsets([e.workspace_bytes for e in self.executors.values()])
        self.segments = {k.name: (off, align_up(ex.workspace_bytes))
                         for k, off, ex in zip(plan.kernels, offsets, self.executors.values())}
        self.arena_bytes = max((o + s for o, s in self.segments.values()), default=0)
        self.arena = cupy().cuda.alloc(max(self.arena_bytes, 1))

    def __call__(self, kernel: str, a: Any, b: Any, out: Any, *, alpha: float = 1.0, beta: float = 0.0) -> Any:
        """Run one kernel of the network plan in its arena segment, on CuPy's current stream."""
        try:
            ex = self.executors[kernel]
        except KeyError:
            raise InputError(f"no kernel {kernel!r} in this plan", "kernel") from None
        off, size = self.segments[kernel]
        return ex(a, b, out, alpha=alpha, beta=beta, workspace=self.arena + off, workspace_bytes=size)
