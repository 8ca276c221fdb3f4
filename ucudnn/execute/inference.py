"""Running an inference plan (``ucudnn-inference-plan/1``, :mod:`ucudnn.planning.inference`) on CuPy arrays.

An :class:`InferenceSession` prepares a plan once: every step's kernel (a conv's WR :class:`Executor` plus one
bias-and-activation pass, a fused block's launcher, ucudnn's pooling, softmax and layout-transform kernels,
concat and add), every intermediate tensor and one workspace shared by the sequential conv steps, all
allocated up front.  A call is then the steps' launches and nothing else, so it can be captured in a CUDA graph
and replayed (``replay=True``: captured on the first call, replayed after; how serving a small batch becomes
GPU-bound rather than bound by the host's launch work).

Weights come as ``{conv node: (weight, bias or None)}`` in PyTorch's conventions (filters ``[K, C/G, R, S]``,
a Linear's ``[K, C]``), NumPy or CuPy, any float dtype: :func:`weights_from_torch` reads them from a PyTorch
model or state dict (BatchNorm folded where the spec says ``bn``), :func:`random_weights` makes some.  The
session converts them once to the plan's dtype and to each step's layout.

:class:`Step` objects are also what :mod:`ucudnn.execute.inference_costs` times, so a plan's costs are the
times of the very launches the session runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..binding.gpu import capture, cupy
from ..kernels.fused import activate
from ..kernels.reference import conv2d_nchw
from ..errors import InputError
from ..planning.inference import FORMAT, INPUT, wide_node
from ..planning.network import Network, op_of
from ..planning.plan import KernelPlan
from ..schemas import validate
from .executor import Executor

Weights = Mapping[str, tuple[Any, Any]]


def shape_in(chw: tuple[int, int, int], n: int, layout: str) -> tuple[int, int, int, int]:
    c, h, w = chw
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


def same_memory(chw: tuple[int, int, int]) -> bool:
    """NCHW and NHWC coincide in memory for a 1x1 plane or one channel: a transform is a reshape."""
    c, h, w = chw
    return h * w == 1 or c == 1


# ---- weights --------------------------------------------------------------------------------------------------------
def _numpy(a: Any) -> np.ndarray:
    if hasattr(a, "detach"):   # a torch tensor (duck-typed: the core never imports torch)
        a = a.detach().float().cpu().numpy()
    elif hasattr(a, "get"):    # a CuPy array
        a = a.get()
    return np.asarray(a, dtype=np.float64)


def weights_from_torch(network: Network, model: Any) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """``{conv node: (weight, bias)}`` from a PyTorch module (or its ``state_dict``) whose module paths are the
    spec's node names; a node's ``bn`` BatchNorm is folded in: w * g / sqrt(var + eps), b' = beta + (b - mean) *
    g / sqrt(var + eps), with the module's ``eps`` (1e-5 from a bare state dict)."""
    sd = model.state_dict() if hasattr(model, "state_dict") else dict(model)
    eps_of = {}
    if hasattr(model, "named_modules"):
        eps_of = {name: float(m.eps) for name, m in model.named_modules() if hasattr(m, "running_var")}
    out = {}
    for i, node in enumerate(network.layers):
        name = node["name"]
        if f"{name}.weight" not in sd:
            raise InputError(f"the model has no {name}.weight", f"layers[{i}].name")
        w = _numpy(sd[f"{name}.weight"])
        if w.ndim == 2:   # a Linear as a 1x1 conv
            w = w[:, :, None, None]
        b = _numpy(sd[f"{name}.bias"]) if f"{name}.bias" in sd else None
        bn = node.get("bn")
        if bn:
            g, beta = _numpy(sd[f"{bn}.weight"]), _numpy(sd[f"{bn}.bias"])
            mean, var = _numpy(sd[f"{bn}.running_mean"]), _numpy(sd[f"{bn}.running_var"])
            scale = g / np.sqrt(var + eps_of.get(bn, 1e-5))
            w = w * scale[:, None, None, None]
            b = beta + ((b if b is not None else 0.0) - mean) * scale
        out[name] = (w, b)
    return out


def random_weights(network: Network, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """He-scaled random filters and small biases for every conv node (benchmarks, tests): activations keep their
    scale through a deep network, so FP16 neither overflows nor flushes to zero."""
    rng = np.random.default_rng(seed)
    out = {}
    for node in network.layers:
        cg = node["c"] // node.get("groups", 1)
        fan_in = cg * node["r"] * node["s"]
        w = rng.standard_normal((node["k"], cg, node["r"], node["s"])) * math.sqrt(2.0 / fan_in)
        b = rng.standard_normal(node["k"]) * 0.1 if node.get("bias") else None
        out[node["name"]] = (w, b)
    return out


def wide_weights(network: Network, convs: Sequence[str], weights: Weights) -> tuple[np.ndarray, np.ndarray | None]:
    """The merged conv's (weight, bias) of a wide block (:func:`ucudnn.planning.inference.wide_node`): the convs'
    filters stacked along K in concat order, each zero-padded to the merged window, centred; biases stacked
    (zeros for a conv without one)."""
    node = {n["name"]: n for n in network.nodes}
    merged = wide_node(network, convs)
    if merged is None:
        raise InputError(f"{'+'.join(convs)} cannot run as one conv", "convs")
    r, s = merged["r"], merged["s"]
    ws, bs = [], []
    for c in convs:
        w, b = weights[c]
        w = _numpy(w)
        dr, ds = (r - w.shape[2]) // 2, (s - w.shape[3]) // 2
        ws.append(np.pad(w, ((0, 0), (0, 0), (dr, r - w.shape[2] - dr), (ds, s - w.shape[3] - ds))))
        bs.append(_numpy(b) if b is not None else np.zeros(node[c]["k"]))
    return np.concatenate(ws), (np.concatenate(bs) if merged.get("bias") else None)


# ---- steps ----------------------------------------------------------------------------------------------------------
@dataclass
class Step:
    """One prepared launch: ``run()`` reads ``inputs`` and writes ``out`` (arrays fixed at preparation)."""

    kind: str
    name: str
    run: Callable[[], None]
    out: Any
    workspace_bytes: int = 0
    note: str | None = None   # how the step departs from its plan (a fallback), for the session to report


_BIAS_ACT: dict[tuple, Any] = {}


def _bias_act_kernel(dtype: str, act: str | None, bias: bool, nhwc: bool) -> Any:
    key = (dtype, act, bias, nhwc)
    k = _BIAS_ACT.get(key)
    if k is None:
        cp = cupy()
        body = "float v = (float)y;"
        if bias:
            body += f" v += (float)b[{'i % k' if nhwc else '(i / hw) % k'}];"
        if act == "relu":
            body += " v = fmaxf(v, 0.f);"
        elif act == "relu6":
            body += " v = fminf(fmaxf(v, 0.f), 6.f);"
        body += " y = (T)v;"
        k = _BIAS_ACT[key] = cp.ElementwiseKernel("raw T b, int32 hw, int32 k", "T y", body,
                                                  f"ucudnn_bias_act_{dtype}_{act}_{int(bias)}_{int(nhwc)}")
    return k


def _add_kernel(act: str | None) -> Any:
    key = ("add", act)
    k = _BIAS_ACT.get(key)
    if k is None:
        cp = cupy()
        expr = "float v = (float)a + (float)b;"
        if act == "relu":
            expr += " v = fmaxf(v, 0.f);"
        elif act == "relu6":
            expr += " v = fminf(fmaxf(v, 0.f), 6.f);"
        k = _BIAS_ACT[key] = cp.ElementwiseKernel("T a, T b", "T y", expr + " y = (T)v;", f"ucudnn_add_{act}")
    return k


def prepare_weights(w: Any, b: Any, layout: str, dtype: str) -> tuple[Any, Any]:
    """A conv's weight in ``layout``'s filter order and ``dtype`` on the device, and its bias (or None)."""
    cp = cupy()
    w = _numpy(w)
    if layout == "NHWC":
        w = w.transpose(0, 2, 3, 1)
    wd = cp.asarray(np.ascontiguousarray(w), dtype=dtype)
    bd = None if b is None else cp.asarray(_numpy(b), dtype=dtype)
    return wd, bd


def conv_step(node: dict[str, Any], plan: KernelPlan, x: Any, weight: tuple[Any, Any], out: Any,
              workspace: Callable[[], Any], epilogue: Mapping[str, Any] | None = None,
              numerics: str | None = None) -> Step:
    """A conv node: its WR plan, then bias and activation in one elementwise pass (skipped when there is
    neither); or, given ``epilogue`` (a plan's ``{"engine", ...}``), cuDNN's fused conv + bias + activation of
    that engine configuration.  ``workspace()`` gives the shared workspace array at call time.  An epilogue
    this cuDNN cannot rebuild falls back to the WR plan (the step's ``note`` says why)."""
    w, b = weight
    act = node.get("act")
    p = plan.problem
    note = None
    if epilogue is not None:
        from ..errors import UcudnnError
        from .conv_epilogue import EpilogueConv

        try:
            fused = EpilogueConv(p, b is not None, act, epilogue["engine"], numerics)
        except UcudnnError as e:
            note = f"fused epilogue {epilogue['engine']} unavailable ({e}); ran the WR plan"
        else:
            def run_fused() -> None:
                fused(x, w, b, out, workspace() if fused.workspace_bytes else None)

            return Step("conv", node["name"], run_fused, out, fused.workspace_bytes)
    ex = Executor(plan)
    post = None
    if b is not None or act:
        kern = _bias_act_kernel(p.dtype, act, b is not None, p.layout == "NHWC")
        dummy = b if b is not None else out
        hw, k = np.int32(p.p * p.q), np.int32(p.k)
        post = lambda: kern(dummy, hw, k, out)  # noqa: E731

    def run() -> None:
        ex(x, w, out, workspace=workspace() if ex.workspace_bytes else None)
        if post is not None:
            post()

    return Step("conv", node["name"], run, out, ex.workspace_bytes, note)


def pool_step(node: dict[str, Any], x: Any, out: Any, layout: str) -> Step:
    from ..kernels import pooling

    win = tuple(node["window"])
    stride = tuple(node.get("stride", win))
    pad = tuple(node.get("pad", (0, 0)))
    mode = node["mode"]
    if node.get("ceil_mode"):
        h, w = (x.shape[2], x.shape[3]) if layout == "NCHW" else x.shape[1:3]
        floor = tuple((e + 2 * p - k) // st + 1 for e, k, st, p in zip((h, w), win, stride, pad))
        want = tuple(out.shape[2:] if layout == "NCHW" else out.shape[1:3])
        if floor != want:
            raise InputError(f"ceil_mode makes a {want} output from {(h, w)}; ucudnn's pooling kernel rounds down "
                             f"({floor})", f"{node['name']}.ceil_mode")
    return Step("pool", node["name"], lambda: pooling.pool2d_forward(x, win, stride, pad, mode, layout, out=out), out)


def global_pool_step(name: str, x: Any, out: Any, layout: str) -> Step:
    from ..kernels import pooling

    h, w = (x.shape[2], x.shape[3]) if layout == "NCHW" else x.shape[1:3]
    o = out.reshape(shape_in((out.size // out.shape[0], 1, 1), out.shape[0], layout))
    return Step("global_avg_pool", name,
                lambda: pooling.pool2d_forward(x, (h, w), (h, w), 0, "avg", layout, out=o), out)


def softmax_step(name: str, x: Any, out: Any, layout: str) -> Step:
    from ..kernels import softmax

    n = x.shape[0]
    if layout == "NHWC" or x.size == n * (x.shape[1] if layout == "NCHW" else x.shape[3]):
        c = x.shape[3] if layout == "NHWC" else x.shape[1]
        xv, ov = x.reshape(-1, c), out.reshape(-1, c)   # channels last in memory: rows of C
        return Step("softmax", name, lambda: softmax.softmax_forward(xv, -1, out=ov), out)
    return Step("softmax", name, lambda: softmax.softmax_forward(x, 1, out=out), out)


def concat_step(name: str, xs: Sequence[Any], out: Any, layout: str) -> Step:
    cp = cupy()
    axis = 1 if layout == "NCHW" else 3
    views, c0 = [], 0
    for x in xs:
        c = x.shape[axis]
        views.append((x, out[:, c0:c0 + c] if axis == 1 else out[..., c0:c0 + c]))
        c0 += c

    def run() -> None:
        for x, v in views:
            cp.copyto(v, x)

    return Step("concat", name, run, out)


def add_step(node: dict[str, Any], a: Any, b: Any, out: Any) -> Step:
    kern = _add_kernel(node.get("act"))
    return Step("add", node["name"], lambda: kern(a, b, out), out)


def transform_step(name: str, x: Any, out: Any, src: str, dst: str) -> Step:
    from ..kernels import layout as lk

    return Step("transform", name, lambda: lk.transform_layout(x, src, dst, out=out), out)


def fused_block(network: Network, convs: Sequence[str], mode: str, merge_relu: bool) -> Any:
    """The :class:`kernels.fused.Block` of a plan's fused step (InputError if the kernel cannot run it)."""
    from ..kernels import fused as F

    node = {n["name"]: n for n in network.nodes}
    layers = []
    for name in convs:
        n = node[name]
        if tuple(n.get("dilation", (1, 1))) != (1, 1):
            raise InputError("the fused kernels run dilation 1 only", f"{name}.dilation")
        extra = {}
        if n.get("act") == "relu6":
            if "relu6" not in F.ConvLayer.__dataclass_fields__:
                raise InputError("this build's fused kernels have no ReLU6", f"{name}.act")
            extra["relu6"] = True
        layers.append(F.ConvLayer(n["k"], (n["r"], n["s"]), tuple(n.get("stride", (1, 1))),
                                  tuple(n.get("pad", (0, 0))), n.get("groups", 1), bool(n.get("bias")),
                                  n.get("act") == "relu", **extra))
    first = node[convs[0]]
    return F.Block("+".join(convs), mode, first["c"], tuple(layers), merge_relu, (first["h"], first["w"]))


def fused_step(network: Network, step: Mapping[str, Any], xs: Sequence[Any], weights: Mapping[str, tuple[Any, Any]],
               out: Any, layout: str, dtype: str) -> Step:
    """A fused block's step, on the kernel the plan names (``kernel``; absent: the FMA kernel)."""
    from ..kernels import blocks as K

    block = fused_block(network, step["convs"], step["mode"], step.get("merge_relu", False))
    launch = K.launcher(step.get("kernel", "fma"), block, step["tiling"], dtype, layout, xs[0].shape)
    ws = [weights[c][0] for c in step["convs"]]
    bs = [weights[c][1] for c in step["convs"]]
    x2 = xs[1] if len(xs) > 1 else None
    return Step("fused", step["name"], lambda: launch(xs[0], ws, bs, out, x2), out)


# ---- the session ----------------------------------------------------------------------------------------------------
class InferenceSession:
    """A plan prepared on the current device with ``weights``: ``session(x)`` runs one forward pass.

    ``x`` is copied into :attr:`input` unless it is that array (write there to skip the copy); the result is
    :attr:`output`, overwritten by the next call (copy it to keep it).  ``replay=True`` captures the steps
    into a CUDA graph on the first call and replays it after.
    """

    def __init__(self, plan: Mapping[str, Any], weights: Weights, *, replay: bool = False):
        validate(plan, FORMAT)
        cp = cupy()
        self.plan = plan
        self.network = Network.from_dict(plan["network"])
        self.dtype = plan["dtype"]
        n = self.batch = plan["batch"]
        shapes = self.network.shapes()
        shapes[INPUT] = self.network.input_shape()
        node = {x["name"]: x for x in self.network.nodes}
        missing = [c["name"] for c in self.network.layers if c["name"] not in weights]
        if missing:
            raise InputError(f"no weights for {len(missing)} conv nodes ({', '.join(missing[:3])}...)", "weights")
        self.tensors: dict[str, Any] = {}
        self.input = cp.empty(shape_in(shapes[INPUT], n, plan["input_layout"]), dtype=self.dtype)
        self.tensors[INPUT] = self.input
        self._ws: Any = None
        self._wcache: dict[tuple[str, str], tuple[Any, Any]] = {}

        def w_of(name: str, layout: str) -> tuple[Any, Any]:
            key = (name, layout)
            if key not in self._wcache:
                self._wcache[key] = prepare_weights(*weights[name], layout, self.dtype)
            return self._wcache[key]

        def chw(t: str) -> tuple[int, int, int]:
            return shapes[t.split("@")[0]]

        self.steps: list[Step] = []
        for s in plan["steps"]:
            lo, name = s["layout"], s["name"]
            xs = [self.tensors[t] for t in s["inputs"]]
            if s["kind"] == "transform":
                if same_memory(chw(name)):
                    self.tensors[name] = xs[0].reshape(shape_in(chw(name), n, lo))
                    continue
                out = cp.empty(shape_in(chw(name), n, lo), dtype=self.dtype)
                st = transform_step(name, xs[0], out, s["from"], s["to"])
            else:
                out = cp.empty(shape_in(chw(name), n, lo), dtype=self.dtype)
                kind = s["kind"]
                if kind == "conv":
                    st = conv_step(node[name], KernelPlan.from_dict(s["kernel_plan"]), xs[0], w_of(name, lo), out,
                                   self._workspace, s.get("epilogue"), plan["numerics"])
                elif kind == "wide_conv":
                    merged = wide_node(self.network, s["convs"])
                    if merged is None:
                        raise InputError(f"{'+'.join(s['convs'])} cannot run as one conv", f"steps.{name}.convs")
                    key = (merged["name"], lo)
                    if key not in self._wcache:
                        self._wcache[key] = prepare_weights(*wide_weights(self.network, s["convs"], weights), lo,
                                                            self.dtype)
                    st = conv_step({**merged, "name": name}, KernelPlan.from_dict(s["kernel_plan"]), xs[0],
                                   self._wcache[key], out, self._workspace, s.get("epilogue"), plan["numerics"])
                elif kind == "fused":
                    ws = {c: w_of(c, lo) for c in s["convs"]}
                    st = fused_step(self.network, s, xs, ws, out, lo, self.dtype)
                elif kind == "pool":
                    st = pool_step(node[name], xs[0], out, lo)
                elif kind == "global_avg_pool":
                    st = global_pool_step(name, xs[0], out, lo)
                elif kind == "concat":
                    st = concat_step(name, xs, out, lo)
                elif kind == "add":
                    st = add_step(node[name], xs[0], xs[1], out)
                elif kind == "softmax":
                    st = softmax_step(name, xs[0], out, lo)
                else:  # the schema admits no other kind
                    raise InputError(f"unknown step kind {kind!r}", "steps.kind")
            self.tensors[name] = out
            self.steps.append(st)
        self.notes = {st.name: st.note for st in self.steps if st.note}
        self.workspace_bytes = max((st.workspace_bytes for st in self.steps), default=0)
        if self.workspace_bytes:
            self._ws = cp.empty(self.workspace_bytes, dtype=cp.uint8)
        self.output = self.tensors[plan["output"]]
        self.replay = replay
        self._graph: Any = None
        self._warm = False

    def _workspace(self) -> Any:
        return self._ws

    def run_steps(self) -> None:
        """The steps once, eagerly, on CuPy's current stream (what a capture records)."""
        for st in self.steps:
            st.run()

    def __call__(self, x: Any = None) -> Any:
        if x is not None and x is not self.input:
            if tuple(x.shape) != tuple(self.input.shape):
                raise InputError(f"expected shape {tuple(self.input.shape)} ({self.plan['input_layout']}), got "
                                 f"{tuple(x.shape)}", "x")
            cupy().copyto(self.input, x)
        if not self.replay:
            self.run_steps()
            return self.output
        if self._graph is None:
            if not self._warm:   # lazy work (compiles, tuner lookups) before capture
                self.run_steps()
                self._warm = True
                return self.output
            try:
                self._graph = capture(self.run_steps)
            except Exception as e:  # noqa: BLE001 - a step that cannot be captured: stay eager
                self.replay = False
                self.replay_failure = f"{type(e).__name__}: {e}"
                self.run_steps()
                return self.output
        self._graph.launch(cupy().cuda.get_current_stream())
        return self.output


# ---- float64 reference ----------------------------------------------------------------------------------------------
def _pool64(x: np.ndarray, node: dict[str, Any], out_hw: tuple[int, int]) -> np.ndarray:
    win = node["window"]
    stride = node.get("stride", win)
    ph, pw = node.get("pad", (0, 0))
    fill = -np.inf if node["mode"] == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph + win[0]), (pw, pw + win[1])), constant_values=fill)
    n, c = x.shape[:2]
    out = np.empty((n, c, *out_hw))
    h, w = x.shape[2:]
    for i in range(out_hw[0]):
        for j in range(out_hw[1]):
            a, b = i * stride[0], j * stride[1]
            v = xp[:, :, a:a + win[0], b:b + win[1]]
            if node["mode"] == "max":
                out[:, :, i, j] = v.max(axis=(2, 3))
            else:   # PyTorch's default count_include_pad: the window clipped to the padded input
                hh = min(a + win[0], h + 2 * ph) - a
                ww = min(b + win[1], w + 2 * pw) - b
                out[:, :, i, j] = v.sum(axis=(2, 3)) / (hh * ww)
    return out


def reference(network: Network, weights: Weights, x: Any) -> np.ndarray:
    """The network's output for ``x`` (NCHW) in float64 NumPy, node by node: the numbers a plan must reproduce."""
    shapes = network.shapes()
    ins = network.inputs()
    vals: dict[str, np.ndarray] = {INPUT: _numpy(x)}
    last = INPUT
    for node in network.nodes:
        name, op = node["name"], op_of(node)
        xs = [vals[t] for t in (ins[name] or [INPUT])]
        if op == "conv":
            w, b = weights[name]
            w = _numpy(w)
            v = conv2d_nchw(xs[0], w if w.ndim == 4 else w[:, :, None, None], node.get("pad", (0, 0)),
                            node.get("stride", (1, 1)), node.get("dilation", (1, 1)), node.get("groups", 1))
            if b is not None:
                v += _numpy(b)[None, :, None, None]
            v = activate(v, node.get("act") or "none")
        elif op == "pool":
            v = _pool64(xs[0], node, shapes[name][1:])
        elif op == "global_avg_pool":
            v = xs[0].mean(axis=(2, 3), keepdims=True)
        elif op == "concat":
            v = np.concatenate(xs, axis=1)
        elif op == "add":
            v = activate(xs[0] + xs[1], node.get("act") or "none")
        else:
            e = np.exp(xs[0] - xs[0].max(axis=1, keepdims=True))
            v = e / e.sum(axis=1, keepdims=True)
        vals[name] = v
        last = name
    return vals[last]
