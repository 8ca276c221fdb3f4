"""A forward convolution with its bias and activation in one cuDNN kernel (issue 19): the graph API's fusion.

Why: at inference batch sizes a conv kernel takes a few microseconds, and the separate bias + activation pass
after it (:func:`ucudnn.execute.inference.conv_step`) costs 1.5-2.3 us more per layer.  Profiled on an H100
(SqueezeNet 1.1, FP16, batch 1, replayed): 20 such passes were 37 of the plan's 237 us of kernel time.  cuDNN's
graph API runs ``conv_fprop -> bias -> relu`` as one operation graph, and its engines (precompiled fused
kernels, runtime-fusion kernels) apply the epilogue in the conv's registers.  This module builds that graph for a
conv node, asks the heuristics (modes A and FALLBACK) for engine configurations that satisfy the numerics and the
workspace limit, times each (captured and replayed, as the inference costs are) and names the fastest by its
engine tag, so a plan can rebuild exactly that configuration (:class:`EpilogueConv`).

The planner treats it as one more way to run a conv node: its time beside the WR plan + bias/activation pass,
the faster one runs (:mod:`ucudnn.planning.inference`).  No micro-batching: the whole batch in one call, within
the workspace limit.  The numerics are the graph source's (:func:`~ucudnn.measure.sources.graph.excluded_notes`):
FP32 ``strict`` keeps engines without tensor cores only, so in strict FP32 there is often no fused engine at all
(then the conv simply has no epilogue option).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from .. import numerics as num
from ..errors import CudnnError, InputError, UcudnnError
from ..problem import ConvProblem

#: Activations the graph's relu expresses (relu6: relu clipped at 6).
ACTS = (None, "relu", "relu6")
#: Tensor uids in the operation graph.
UID_X, UID_W, UID_Y, UID_B = 1, 2, 3, 4
#: Engine configurations timed per conv, in heuristic order (each may compile at build time).
MAX_CANDIDATES = 4


@dataclass(frozen=True)
class Epilogue:
    """A tuned fused configuration: the engine tag to rebuild, its workspace, its replayed time."""

    engine: str
    workspace_bytes: int
    ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "workspace_bytes": self.workspace_bytes, "ms": self.ms}

    @classmethod
    def from_dict(cls, d: Any, field: str = "epilogue") -> "Epilogue":
        if not isinstance(d, dict) or not isinstance(d.get("engine"), str):
            raise InputError("expected {engine, workspace_bytes, ms}", field)
        return cls(d["engine"], int(d.get("workspace_bytes", 0)), float(d.get("ms", 0.0)))


def _graph(problem: ConvProblem, bias: bool, act: str | None) -> Any:
    """The operation graph conv -> (bias) -> (activation), validated, with its heuristics' configurations."""
    from ..binding.gpu import handle
    from ..measure.sources.graph import frontend, tensor_layout

    if act not in ACTS:
        raise InputError(f"the fused epilogue runs {ACTS[1:]} or none, got {act!r}", "act")
    fe = frontend()
    dt = {"float32": fe.data_type.FLOAT, "float16": fe.data_type.HALF}[problem.dtype]
    f32 = fe.data_type.FLOAT
    g = fe.pygraph(io_data_type=dt, intermediate_data_type=f32, compute_data_type=f32, handle=handle())
    lay = tensor_layout(problem)
    x = g.tensor(dim=lay["x"][0], stride=lay["x"][1], data_type=dt, name="x", uid=UID_X)
    w = g.tensor(dim=lay["w"][0], stride=lay["w"][1], data_type=dt, name="w", uid=UID_W)
    t = g.conv_fprop(x, w, padding=list(problem.pad), stride=list(problem.stride), dilation=list(problem.dilation),
                     compute_data_type=f32, name="conv")
    if bias:
        k = problem.k
        b = g.tensor(dim=[1, k, 1, 1], stride=[k, 1, k, k] if problem.layout == "NHWC" else [k, 1, 1, 1],
                     data_type=dt, name="b", uid=UID_B)
        t = g.bias(name="bias", input=t, bias=b)
    if act == "relu":
        t = g.relu(name="act", input=t)
    elif act == "relu6":
        t = g.relu(name="act", input=t, lower_clip=0.0, upper_clip=6.0)
    t.set_output(True)
    t.set_dim(lay["y"][0])
    t.set_stride(lay["y"][1])
    t.set_data_type(dt)
    t.set_uid(UID_Y)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([fe.heur_mode.A, fe.heur_mode.FALLBACK])
    return g


def _filtered(g: Any, problem: ConvProblem, numerics: str | None, workspace_limit: int) -> None:
    from ..measure.sources.graph import excluded_notes, frontend

    fe = frontend()
    excluded = excluded_notes(num.normalize(numerics, problem.dtype), problem.dtype)
    if excluded:
        g.deselect_numeric_notes([getattr(fe.numerical_note, n) for n in excluded])
    g.deselect_workspace_greater_than(int(workspace_limit))


class EpilogueConv:
    """One built fused configuration: ``conv(x, w, b, y, workspace)`` runs it on CuPy's current stream.

    Built from the engine tag a plan recorded; :class:`CudnnError` if this cuDNN / device does not offer it."""

    def __init__(self, problem: ConvProblem, bias: bool, act: str | None, engine: str, numerics: str | None = None,
                 workspace_limit: int = 1 << 62):
        from ..measure.sources.graph import EngineIdentity

        self.problem, self.bias, self.act = problem, bias, act
        want = EngineIdentity.parse_tag(engine)
        try:
            g = _graph(problem, bias, act)
            _filtered(g, problem, numerics, workspace_limit)
        except UcudnnError:
            raise
        except Exception as e:  # noqa: BLE001 - the frontend's own error types
            raise CudnnError("graph epilogue", -1, "GRAPH_NOT_SUPPORTED", _first_line(e)) from None
        for i in range(g.get_execution_plan_count()):
            try:
                if EngineIdentity.parse_tag(g.get_plan_name_at_index(i)) != want:
                    continue
                g.build_plan_at_index(i)
            except InputError:
                continue
            except Exception as e:  # noqa: BLE001
                raise CudnnError("graph epilogue build", -1, "GRAPH_PLAN_BUILD_FAILED", _first_line(e)) from None
            self.graph, self.index = g, i
            self.workspace_bytes = int(g.get_workspace_size_plan_at_index(i))
            return
        raise CudnnError("graph epilogue", -1, "GRAPH_ENGINE_NOT_FOUND",
                         f"{engine} is not among the fused configurations of this cuDNN / device")

    def __call__(self, x: Any, w: Any, b: Any, y: Any, workspace: Any = None) -> None:
        from ..binding.gpu import handle

        self.graph.execute_plan_at_index(_pack(x, w, b if self.bias else None, y),
                                         0 if workspace is None else _ptr(workspace), self.index, handle=handle())


def tune(problem: ConvProblem, bias: bool, act: str | None, numerics: str | None, workspace_limit: int,
         operands: tuple[Any, Any, Any, Any], timer: Callable[[Callable[[], None]], float],
         max_candidates: int = MAX_CANDIDATES) -> tuple[Epilogue | None, str]:
    """The fastest fused configuration of this conv on ``operands`` (x, w, b, y), timed by ``timer``; with a
    one-line account (how many were offered, built, timed, or why none).  Never raises for an unsupported
    graph: (None, reason)."""
    from ..binding.gpu import cupy
    from ..measure.sources.graph import EngineIdentity, classify_failure

    t0 = time.perf_counter()
    try:
        g = _graph(problem, bias, act)
        _filtered(g, problem, numerics, workspace_limit)
        count = g.get_execution_plan_count()
    except Exception as e:  # noqa: BLE001 - unsupported graph, frontend missing: no epilogue option
        return None, f"no fused configuration: {_first_line(e)}"
    cp = cupy()
    x, w, b, y = operands
    best: Epilogue | None = None
    built = timed = 0
    failures: list[str] = []
    seen: set[str] = set()
    for i in range(count):
        if built >= max_candidates:
            break
        try:
            tag = EngineIdentity.parse_tag(g.get_plan_name_at_index(i)).tag
        except InputError:
            continue
        if tag in seen:
            continue
        seen.add(tag)
        try:
            g.build_plan_at_index(i)
        except Exception as e:  # noqa: BLE001
            failures.append(classify_failure(str(e)))
            continue
        built += 1
        ws_bytes = int(g.get_workspace_size_plan_at_index(i))
        ws = cp.empty(max(ws_bytes, 1), dtype=cp.uint8)
        pack = _pack(x, w, b if bias else None, y)

        def run(i: int = i, pack: dict = pack, ws: Any = ws) -> None:
            from ..binding.gpu import handle

            g.execute_plan_at_index(pack, _ptr(ws), i, handle=handle())
        try:
            ms = timer(run)
        except Exception as e:  # noqa: BLE001 - fails to run or to capture: not an option
            failures.append(f"{tag}: {_first_line(e)}")
            continue
        timed += 1
        if best is None or ms < best.ms:
            best = Epilogue(tag, ws_bytes, ms)
    why = (f"{count} offered, {built} built, {timed} timed in {time.perf_counter() - t0:.1f} s"
           + (f"; failures: {'; '.join(sorted(set(failures))[:3])}" if failures else ""))
    return best, why


def _pack(x: Any, w: Any, b: Any, y: Any) -> dict[int, int]:
    """The graph's variant pack: device pointers by tensor uid (the bias only where there is one)."""
    pack = {UID_X: _ptr(x), UID_W: _ptr(w), UID_Y: _ptr(y)}
    if b is not None:
        pack[UID_B] = _ptr(b)
    return pack


def _ptr(a: Any) -> int:
    return int(a.data.ptr) if hasattr(a, "data") and hasattr(a.data, "ptr") else int(a)


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:200] if s else type(e).__name__
