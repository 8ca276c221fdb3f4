"""Inference planning for a whole network (issue 19): per block fused or per layer, per layer the layout.

Input: a whole-graph network spec (:class:`~ucudnn.planning.network.Network` with pooling, concat, add and
softmax nodes) and :class:`InferenceCosts`, what each way of running each part took on the device, executed and
replayed in a CUDA graph (:mod:`ucudnn.execute.inference_costs` measures them):

* every node in every layout it runs in (a conv: its WR plan under the workspace limit plus bias and activation);
* every fusable block (:func:`find_blocks`: seed 004's straight, split and merge patterns found in the graph) as
  one fused kernel in each layout; every wide block (a concat of convs reading one tensor: :func:`wide_node`) as
  one conv with the filters stacked;
* where cuDNN's graph API fuses them, a conv's bias and activation into the conv kernel (``epilogues``: one more
  way to run a conv node or a wide block's merged conv; the faster way is taken);
* every tensor's layout transform (zero for a tensor whose layouts coincide in memory: a 1x1 plane or one
  channel).

The choice, in two steps:

1. **Fusion**: candidate blocks may overlap (MobileNet's expand -> depthwise and depthwise -> project share the
   depthwise); the non-overlapping set is chosen greedily by saving (the best per-layer time of its layers minus
   the best fused time, each over layouts), largest first, and only blocks that save time are kept.  A kept
   block is one unit whose cost in a layout is the better of fused and per layer *in that layout*, so a layout
   where fusion loses runs the block's layers one by one.
2. **Layouts**: the units form a graph; :func:`ucudnn.planning.layouts.choose_layouts` picks each unit's layout
   with one transform per (tensor, target layout) paid once (a DP on a chain, an ILP with branches), never worse
   than the whole network in one layout.  Seed 000's heuristic and each single layout are evaluated on the same
   costs and reported beside it (``baselines``); of the assignments within :data:`LAYOUT_MARGIN` (1%) of the
   best, the one with the fewest transforms runs: a gain inside the timings' noise does not pay for transforms
   (a single layout is then never slower, measured, than itself).

The result is a plan document (``ucudnn-inference-plan/1``, its own JSON Schema): the steps to run in order,
each with its layout, the kernel plan or fused tiling it runs, and its measured time; the costs it was planned
from are kept in it, so a plan can be re-planned without a GPU (:func:`replan`).  Pure Python: no GPU.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import InputError
from ..schemas import validate
from . import layouts as lay
from .network import Network, op_of

FORMAT = "ucudnn-inference-plan/1"
LAYOUTS = ("NCHW", "NHWC")
INPUT = lay.INPUT


# ---- fusable blocks in a graph -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockCandidate:
    """A part of the graph one fused kernel (seed 004) can run.

    ``convs``: the conv nodes in the fused kernel's layer order (straight: L1, L2; split: squeeze, the two
    concatenated expands in concat order; merge: the two added convs, then the consumer); ``nodes``: every node it
    covers (the convs and the concat / add); ``output``: the node whose tensor it produces; ``inputs``: the
    tensors it reads (merge: x for L1, x2 for L2).
    """

    mode: str
    convs: tuple[str, ...]
    nodes: tuple[str, ...]
    output: str
    inputs: tuple[str, ...]
    merge_relu: bool = False

    @property
    def name(self) -> str:
        return f"{self.mode}:{'+'.join(self.convs)}"


def find_blocks(network: Network) -> list[BlockCandidate]:
    """Every place in ``network`` where one of seed 004's three modes applies (candidates may overlap).

    A block's inner tensors must be read by the block alone (else they would have to be written out anyway):
    straight ``A -> B`` where B is A's only reader; split ``A -> (B | C) -> concat`` where B and C read A only and
    the concat is their only reader; merge ``add(A(x), B(x2)) -> C`` where the add is A's and B's only reader, C
    the add's.  Whether the fused kernel supports the layers (filter sizes, groups, shared memory) is the
    measuring step's question: a candidate it cannot run gets no fused time and is never chosen.
    """
    inputs = network.inputs()
    readers = network.consumers()
    node = {n["name"]: n for n in network.nodes}

    def conv(name: str) -> bool:
        return name in node and op_of(node[name]) == "conv"

    def act(name: str) -> str | None:
        return node[name].get("act")

    def sole_input(name: str) -> str:
        ins = inputs[name]
        return ins[0] if ins else INPUT

    out: list[BlockCandidate] = []
    for n in network.nodes:
        a = n["name"]
        if op_of(n) == "conv":
            rd = readers[a]
            if len(rd) == 1 and conv(rd[0]) and inputs[rd[0]] == [a]:
                out.append(BlockCandidate("straight", (a, rd[0]), (a, rd[0]), rd[0], (sole_input(a),)))
            if len(rd) == 2 and all(conv(r) and inputs[r] == [a] for r in rd):
                cats = {tuple(readers[r]) for r in rd}
                if len(cats) == 1 and len(next(iter(cats))) == 1:
                    cat = next(iter(cats))[0]
                    if op_of(node[cat]) == "concat" and sorted(inputs[cat]) == sorted(rd) and len(inputs[cat]) == 2:
                        b, c = inputs[cat]
                        out.append(BlockCandidate("split", (a, b, c), (a, b, c, cat), cat, (sole_input(a),)))
        elif op_of(n) == "add" and len(inputs[a]) == 2 and act(a) in (None, "relu"):
            p, q = inputs[a]
            rd = readers[a]
            if (conv(p) and conv(q) and readers[p] == [a] and readers[q] == [a] and len(rd) == 1 and conv(rd[0])
                    and inputs[rd[0]] == [a]):
                out.append(BlockCandidate("merge", (p, q, rd[0]), (p, q, a, rd[0]), rd[0],
                                          (sole_input(p), sole_input(q)), merge_relu=act(a) == "relu"))
    for n in network.nodes:   # wide: a concat of convs that all read one tensor, as one conv (wide_node)
        cat = n["name"]
        if op_of(n) != "concat":
            continue
        parts = inputs[cat]
        if (len(parts) >= 2 and all(conv(p) and readers[p] == [cat] for p in parts)
                and len({tuple(inputs[p]) for p in parts}) == 1 and wide_node(network, parts) is not None):
            out.append(BlockCandidate("wide", tuple(parts), (*parts, cat), cat, (sole_input(parts[0]),)))
    return out


def wide_node(network: Network, convs: Sequence[str]) -> dict[str, Any] | None:
    """The one conv node that computes the channel concatenation of ``convs`` (which read the same tensor), or
    None where no single conv can.

    Why: SqueezeNet's fire modules end in a 1x1 and a 3x3 conv of one tensor, concatenated; at small batches each
    is a few-microsecond kernel followed by its bias pass and a copy into the concat.  One conv with the filters
    stacked along K (the smaller filters zero-padded, centred) writes the concatenation directly: one launch
    instead of two convs, two bias passes and two copies, for more FLOPs that small batches do not feel.  The
    zero taps add exact zeros, so the result is the per-layer one up to the order of the sums.

    Conditions: groups 1, dilation 1, one stride, one activation, and pads that centre each filter in the merged
    window (a conv of r x r with pad p fits an R x R window with pad P when (R - r) / 2 = P - p, per axis).
    """
    node = {n["name"]: n for n in network.nodes}
    ns = [node[c] for c in convs]
    if any(n.get("groups", 1) != 1 or tuple(n.get("dilation", (1, 1))) != (1, 1) for n in ns):
        return None
    if len({tuple(n.get("stride", (1, 1))) for n in ns}) != 1 or len({n.get("act") for n in ns}) != 1:
        return None
    if len({(n["c"], n["h"], n["w"]) for n in ns}) != 1:
        return None
    big_r, big_s = max(n["r"] for n in ns), max(n["s"] for n in ns)
    pads = set()
    for n in ns:
        dr, ds = big_r - n["r"], big_s - n["s"]
        if dr % 2 or ds % 2:
            return None
        ph, pw = tuple(n.get("pad", (0, 0)))
        pads.add((ph + dr // 2, pw + ds // 2))
    if len(pads) != 1:
        return None
    first = ns[0]
    return {"name": "wide:" + "+".join(convs), "op": "conv", "c": first["c"], "h": first["h"], "w": first["w"],
            "k": sum(n["k"] for n in ns), "r": big_r, "s": big_s, "pad": list(pads.pop()),
            "stride": list(first.get("stride", (1, 1))), "bias": any(n.get("bias") for n in ns),
            **({"act": first["act"]} if first.get("act") else {})}


# ---- what was measured ----------------------------------------------------------------------------------------------
#: InferenceCosts' per-part maps (empty when absent from a document)
_COST_MAPS = ("nodes", "blocks", "transforms", "conv_plans", "tilings", "declined", "epilogues", "block_kernels")


@dataclass
class InferenceCosts:
    """Measured ms of every part, executed and replayed (module doc); ``conv_plans`` and ``tilings`` record what
    ran: a conv node's WR kernel plan per layout (``KernelPlan.to_dict``), a block's fused tiling per layout."""

    network: str
    batch: int
    dtype: str
    numerics: str
    workspace_limit: int
    device: str = ""
    cudnn_version: int = 0
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)
    blocks: dict[str, dict[str, float]] = field(default_factory=dict)
    transforms: dict[str, dict[str, float]] = field(default_factory=dict)
    conv_plans: dict[str, dict[str, dict]] = field(default_factory=dict)
    tilings: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    #: a block's fused kernel per layout where it is not the FMA kernel (:data:`kernels.blocks.KERNELS`: in FP16
    #: the tensor-core ones); its tiling is in ``tilings``
    block_kernels: dict[str, dict[str, str]] = field(default_factory=dict)
    declined: dict[str, str] = field(default_factory=dict)   # what could not be measured, and why
    #: a conv node's (or a wide block's merged conv's) fused conv + bias + activation in one cuDNN kernel, per
    #: layout: ``{"engine", "workspace_bytes", "ms"}`` (:mod:`ucudnn.execute.conv_epilogue`)
    epilogues: dict[str, dict[str, dict]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("network", "batch", "dtype", "numerics", "workspace_limit", "device",
                                              "cudnn_version", *_COST_MAPS)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "InferenceCosts":
        return cls(**{k: d[k] for k in ("network", "batch", "dtype", "numerics", "workspace_limit")},
                   **{k: d.get(k, cls.__dataclass_fields__[k].default_factory())  # type: ignore[misc]
                      for k in _COST_MAPS},
                   device=d.get("device", ""), cudnn_version=d.get("cudnn_version", 0))

    def epilogue(self, key: str, layout: str, than: float | None) -> dict | None:
        """The fused epilogue of ``key`` (a conv node or a wide block) in ``layout`` if it beats ``than`` (the
        WR plan + bias/activation pass; None: that way was not measured), else None."""
        e = self.epilogues.get(key, {}).get(layout)
        return e if e is not None and (than is None or e["ms"] < than) else None

    def node_ms(self, name: str, layout: str) -> float | None:
        """A node's time in ``layout``: the faster of its measured ways (a conv: WR + bias pass, or fused)."""
        base = self.nodes.get(name, {}).get(layout)
        e = self.epilogue(name, layout, base)
        return e["ms"] if e is not None else base

    def block_ms(self, block: "BlockCandidate", layout: str) -> float | None:
        """A block's fused time in ``layout`` (a wide block: its merged conv, WR + bias pass or fused)."""
        base = self.blocks.get(block.name, {}).get(layout)
        e = self.epilogue(block.name, layout, base) if block.mode == "wide" else None
        return e["ms"] if e is not None else base

    def transform_ms(self, tensor: str, src: str, dst: str) -> float:
        if src == dst:
            return 0.0
        try:
            return self.transforms[tensor][f"{src}>{dst}"]
        except KeyError:
            raise InputError(f"no measured {src} -> {dst} transform of {tensor!r}", f"costs.transforms.{tensor}") \
                from None


# ---- the plan -------------------------------------------------------------------------------------------------------
@dataclass
class _Unit:
    name: str                 # the tensor it produces
    inputs: tuple[str, ...]
    costs: dict[str, float]
    block: BlockCandidate | None = None
    fused_in: tuple[str, ...] = ()   # layouts in which the block runs fused (else per layer)


def _per_layer(costs: InferenceCosts, nodes: Sequence[str], layout: str) -> float | None:
    times = [costs.node_ms(n, layout) for n in nodes]
    return None if None in times else sum(times)  # type: ignore[arg-type]


def _fused_times(costs: InferenceCosts, b: BlockCandidate) -> dict[str, float]:
    return {lo: t for lo in LAYOUTS if (t := costs.block_ms(b, lo)) is not None}


def choose_blocks(network: Network, costs: InferenceCosts, fuse: bool = True) -> list[BlockCandidate]:
    """Step 1 of the module doc: non-overlapping blocks, largest saving first, each saving time."""
    if not fuse:
        return []
    scored = []
    for b in find_blocks(network):
        fused = _fused_times(costs, b)
        per = [t for t in (_per_layer(costs, b.nodes, lo) for lo in LAYOUTS) if t is not None]
        if fused and per and min(fused.values()) < min(per):
            scored.append((min(per) - min(fused.values()), b))
    chosen: list[BlockCandidate] = []
    taken: set[str] = set()
    for _, b in sorted(scored, key=lambda s: -s[0]):
        if taken.isdisjoint(b.nodes):
            chosen.append(b)
            taken.update(b.nodes)
    return chosen


def _units(network: Network, costs: InferenceCosts, blocks: Sequence[BlockCandidate]) -> list[_Unit]:
    inputs = network.inputs()
    owner = {n: b for b in blocks for n in b.nodes}
    units = []
    for node in network.nodes:
        name = node["name"]
        b = owner.get(name)
        if b is None:
            c = {lo: t for lo in LAYOUTS if (t := costs.node_ms(name, lo)) is not None}
            if not c:
                raise InputError(f"no measured time for node {name!r} in any layout"
                                 f"{': ' + costs.declined[name] if name in costs.declined else ''}",
                                 f"costs.nodes.{name}")
            units.append(_Unit(name, tuple(inputs[name]) or (INPUT,), c))
        elif name == b.output:
            c, fused_in = {}, []
            for lo in LAYOUTS:
                per, fused = _per_layer(costs, b.nodes, lo), costs.block_ms(b, lo)
                options = [t for t in (per, fused) if t is not None]
                if options:
                    c[lo] = min(options)
                    if fused is not None and fused == c[lo]:
                        fused_in.append(lo)
            units.append(_Unit(name, b.inputs, c, b, tuple(fused_in)))
    return units


def _assign(units: Sequence[_Unit], costs: InferenceCosts, input_layout: str, output_layout: str | None,
            how: str, shapes: dict[str, tuple[int, int, int]], batch: int) -> lay.Assignment | None:
    nodes = [lay.Node(u.name, u.inputs, u.costs) for u in units]
    transform = costs.transform_ms
    if how == "choice":
        return lay.choose_layouts(nodes, transform, input_layout, output_layout)
    if how == "seed_heuristic":
        chans = {}
        for u in units:
            first = u.block.convs[0] if u.block else u.name
            src = u.block.inputs[0] if u.block else u.inputs[0]
            chans[u.name] = shapes[src][0] if src in shapes else shapes[first][0]
        return lay.seed_heuristic(nodes, chans, batch, transform, input_layout, conv_layout="NCHW",
                                  wide_layout="NHWC", output_layout=output_layout)
    if all(how in n.costs for n in nodes):
        return lay.evaluate(nodes, {n.name: how for n in nodes}, transform, input_layout, output_layout)
    return None


#: how much faster (relative) an assignment with more layout transforms must be predicted to be chosen over one with
#: fewer (a single layout has the fewest; the seed heuristic's is another candidate):
#: two replayed measurements of one plan differ by up to ~0.6% (H100, SqueezeNet 1.1: 0.2859 vs 0.2843 ms), and a
#: mixed plan predicted 0.006% ahead ran 0.5% behind the single layout (FP16 batch 64, 0.5492 vs 0.5466 ms)
LAYOUT_MARGIN = 0.01


def plan_inference(network: Network, costs: InferenceCosts, *, input_layout: str = "NCHW",
                   output_layout: str | None = None, fuse: bool = True,
                   layouts: Sequence[str] | None = None, epilogues: bool = True) -> dict[str, Any]:
    """The inference plan document for ``network`` from ``costs`` (module doc); ``output_layout`` defaults to
    ``input_layout``; ``fuse=False`` plans every layer on its own (the unfused baseline: no fused or wide
    blocks); ``layouts`` restricts the layouts layers may run in (``["NHWC"]``: the whole network in NHWC, the
    input transformed first); ``epilogues=False`` leaves out cuDNN's fused conv + bias + activation."""
    if input_layout not in LAYOUTS:
        raise InputError(f"must be one of {LAYOUTS}, got {input_layout!r}", "input_layout")
    output_layout = output_layout or input_layout
    if output_layout not in LAYOUTS:
        raise InputError(f"must be one of {LAYOUTS}, got {output_layout!r}", "output_layout")
    if costs.network != network.name:
        raise InputError(f"costs were measured for {costs.network!r}, not {network.name!r}", "costs.network")
    shapes = network.shapes()
    if layouts is not None:
        if not layouts or any(lo not in LAYOUTS for lo in layouts):
            raise InputError(f"must be a non-empty subset of {LAYOUTS}, got {list(layouts)!r}", "layouts")
        keep = set(layouts)

        def only(table: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
            return {name: {lo: t for lo, t in c.items() if lo in keep} for name, c in table.items()}

        costs = dataclasses.replace(costs, nodes=only(costs.nodes), blocks=only(costs.blocks),
                                    epilogues=only(costs.epilogues))  # type: ignore[arg-type]
    if not epilogues:
        costs = dataclasses.replace(costs, epilogues={})
    blocks = choose_blocks(network, costs, fuse)
    units = _units(network, costs, blocks)
    best = _assign(units, costs, input_layout, output_layout, "choice", shapes, costs.batch)
    assert best is not None
    baselines: dict[str, float | None] = {}
    near: list[lay.Assignment] = [best]
    for how in (*LAYOUTS, "seed_heuristic"):
        a = _assign(units, costs, input_layout, output_layout, how, shapes, costs.batch)
        baselines[how] = None if a is None else round(a.total_ms, 6)
        if a is not None and a.total_ms <= best.total_ms * (1 + LAYOUT_MARGIN):
            near.append(a)
    # predicted gains within the timings' noise do not pay for transforms: of the assignments within LAYOUT_MARGIN
    # of the best, the one with the fewest transforms runs (a single layout where one is that close)
    best = min(near, key=lambda a: (len(a.transforms), a.total_ms))
    if fuse:
        unfused = plan_inference(network, costs, input_layout=input_layout, output_layout=output_layout, fuse=False,
                                 layouts=layouts, epilogues=epilogues)
        baselines["unfused"] = unfused["predicted_ms"]
    steps = _steps(network, units, best, costs, input_layout, output_layout)
    doc = {"format": FORMAT, "network": network.to_dict(), "batch": costs.batch, "dtype": costs.dtype,
           "numerics": costs.numerics, "workspace_limit": costs.workspace_limit, "device": costs.device,
           "cudnn_version": costs.cudnn_version, "input_layout": input_layout, "output_layout": output_layout,
           "fuse": fuse, **({"layouts": sorted(layouts)} if layouts is not None else {}),
           **({} if epilogues else {"epilogues": False}), "steps": steps, "output": steps[-1]["name"],
           "predicted_ms": round(sum(s["ms"] for s in steps), 6), "baselines": baselines,
           "costs": costs.to_dict()}
    validate(doc, FORMAT)
    return doc


def _steps(network: Network, units: Sequence[_Unit], best: lay.Assignment, costs: InferenceCosts,
           input_layout: str, output_layout: str) -> list[dict[str, Any]]:
    """The plan's steps in order: each unit in its layout (a block fused, or its layers one by one), preceded by
    the transforms of its inputs it needs, each transform made once."""
    node = {n["name"]: n for n in network.nodes}
    inputs = network.inputs()
    placed = {INPUT: input_layout}
    have: dict[tuple[str, str], str] = {}   # (tensor, layout) -> the step name holding it
    steps: list[dict[str, Any]] = []

    def tensor(t: str, want: str) -> str:
        if placed[t] == want:
            return t
        key = (t, want)
        if key not in have:
            name = f"{t}@{want}"
            steps.append({"kind": "transform", "name": name, "nodes": [], "inputs": [t], "layout": want,
                          "from": placed[t], "to": want, "ms": round(costs.transform_ms(t, placed[t], want), 6)})
            have[key] = name
        return have[key]

    def one(name: str, layout: str, ins: list[str]) -> dict[str, Any]:
        n = node[name]
        s: dict[str, Any] = {"kind": op_of(n), "name": name, "nodes": [name], "inputs": ins, "layout": layout,
                             "ms": round(costs.node_ms(name, layout), 6)}  # type: ignore[arg-type]
        if op_of(n) == "conv":
            s["kernel_plan"] = costs.conv_plans[name][layout]
            e = costs.epilogue(name, layout, costs.nodes.get(name, {}).get(layout))
            if e is not None:
                s["epilogue"] = e
        return s

    for u in units:
        lo = best.layouts[u.name]
        ins = [tensor(t, lo) for t in u.inputs]
        if u.block is None:
            steps.append(one(u.name, lo, ins))
        elif lo in u.fused_in and u.block.mode == "wide":
            b = u.block
            s = {"kind": "wide_conv", "name": b.output, "nodes": list(b.nodes), "convs": list(b.convs),
                 "inputs": ins, "layout": lo, "kernel_plan": costs.conv_plans[b.name][lo],
                 "ms": round(costs.block_ms(b, lo), 6)}  # type: ignore[arg-type]
            e = costs.epilogue(b.name, lo, costs.blocks.get(b.name, {}).get(lo))
            if e is not None:
                s["epilogue"] = e
            steps.append(s)
        elif lo in u.fused_in:
            b = u.block
            s = {"kind": "fused", "name": b.output, "nodes": list(b.nodes), "convs": list(b.convs), "mode": b.mode,
                 "merge_relu": b.merge_relu, "inputs": ins, "layout": lo, "tiling": costs.tilings[b.name][lo],
                 "ms": round(costs.block_ms(b, lo), 6)}  # type: ignore[arg-type]
            kernel = costs.block_kernels.get(b.name, {}).get(lo)
            if kernel is not None:
                s["kernel"] = kernel
            steps.append(s)
        else:   # per layer: the block's nodes in graph order, their inner tensors already in this layout
            for name in u.block.nodes:
                steps.append(one(name, lo, [x if x in u.block.nodes else ins[u.block.inputs.index(x)]
                                            for x in (inputs[name] or [INPUT])]))
        placed[u.name] = lo
        for name in (u.block.nodes if u.block else ()):
            placed[name] = lo
    last = units[-1].name
    if placed[last] != output_layout:
        tensor(last, output_layout)
    return steps


def replan(doc: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """Plan again from the costs a plan document holds (other layouts, fusion off): no GPU needed."""
    validate(doc, FORMAT)
    net = Network.from_dict(doc["network"])
    kw.setdefault("input_layout", doc["input_layout"])
    return plan_inference(net, InferenceCosts.from_dict(doc["costs"]), **kw)


def load_plan(path: str | Path) -> dict[str, Any]:
    """An inference plan document from a file, validated (errors name the field)."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}", "plan") from None
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON: {e}", "plan") from None
    validate(doc, FORMAT)
    return doc
