"""Network-wide layout choice (issue 19, seed 000 section IV): which layout each layer runs in.

The best layout depends on the layer (seed 000: CHWN for few input channels or large batches, NCHW otherwise;
on Hopper NHWC is the third candidate), and a change of layout between two layers costs a transform of the
tensor between them.  Given every layer's measured time in each layout it supports and the measured cost of
each transform, the cheapest assignment is

    min  sum_v cost(v, x_v) + sum_u sum_{b != x_u, b wanted by a consumer of u} transform(u, x_u, b)

A transform of one tensor into one layout is paid once however many consumers read it (a fire module's two
expands, a residual's add).  On a chain this is a shortest path over (layer, layout), solved by dynamic
programming (:func:`choose_chain`); a graph with branches and merges is solved exactly as a small ILP with PuLP
(:func:`choose_layouts`: a binary per (layer, layout), a binary per (tensor, from, to) forced on by its
producer's and a consumer's layouts), as the WD planner is.  Either way the result is never slower than running
the whole network in its best single layout: that is one of the assignments compared.  :func:`seed_heuristic`
is seed 000's rule, the baseline the choice must match or beat.

Pure Python (PuLP for the ILP): no GPU.  The costs come from measurements (the per-layer plans' times and
ucudnn's transform kernels' times); this module only decides.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ..errors import InfeasibleError, InputError

#: transform(tensor, from_layout, to_layout) -> ms: what converting the named layer's output costs
TransformCost = Callable[[str, str, str], float]
INPUT = "input"


@dataclass(frozen=True)
class Node:
    """One layer: its inputs (names of earlier nodes, or ``input``) and its time in each layout it supports."""

    name: str
    inputs: tuple[str, ...]
    costs: Mapping[str, float] = field(hash=False)

    def __post_init__(self) -> None:
        if not self.costs:
            raise InputError(f"layer {self.name!r} supports no layout", f"{self.name}.costs")
        for layout, ms in self.costs.items():
            if not (isinstance(ms, (int, float)) and math.isfinite(ms) and ms >= 0):
                raise InputError(f"must be a finite time >= 0, got {ms!r}", f"{self.name}.costs.{layout}")


@dataclass(frozen=True)
class Assignment:
    """The layout of every layer and what the whole network then costs (layers + transforms, ms)."""

    layouts: dict[str, str]
    total_ms: float
    transforms: list[tuple[str, str, str]]   # (tensor, from, to), each paid once


def _check(nodes: Sequence[Node]) -> None:
    seen = {INPUT}
    for i, n in enumerate(nodes):
        if n.name in seen:
            raise InputError(f"duplicate layer name {n.name!r}", f"nodes[{i}].name")
        for inp in n.inputs:
            if inp not in seen:
                raise InputError(f"input {inp!r} is not an earlier layer (nodes must be in topological order)",
                                 f"nodes[{i}].inputs")
        seen.add(n.name)


def evaluate(nodes: Sequence[Node], layouts: Mapping[str, str], transform: TransformCost, input_layout: str,
             output_layout: str | None = None) -> Assignment:
    """What running ``nodes`` in ``layouts`` costs: each layer's time plus one transform per (tensor, target
    layout) that a consumer (or the required ``output_layout`` of the last layer) reads in another layout."""
    placed = {INPUT: input_layout, **layouts}
    total = sum(n.costs[layouts[n.name]] for n in nodes)
    wanted: dict[str, set[str]] = {}
    for n in nodes:
        for inp in n.inputs:
            wanted.setdefault(inp, set()).add(layouts[n.name])
    if output_layout is not None and nodes:
        wanted.setdefault(nodes[-1].name, set()).add(output_layout)
    moves = sorted((t, placed[t], b) for t, bs in wanted.items() for b in bs if b != placed[t])
    total += sum(transform(t, a, b) for t, a, b in moves)
    return Assignment(dict(layouts), total, moves)


def single_layout(nodes: Sequence[Node], transform: TransformCost, input_layout: str,
                  output_layout: str | None = None) -> Assignment | None:
    """The best whole network in one layout (the baseline a per-layer choice must never lose to); None: no
    layout is supported by every layer."""
    common = set.intersection(*(set(n.costs) for n in nodes)) if nodes else set()
    options = [evaluate(nodes, {n.name: lay for n in nodes}, transform, input_layout, output_layout)
               for lay in sorted(common)]
    return min(options, key=lambda a: a.total_ms, default=None)


def seed_heuristic(nodes: Sequence[Node], channels: Mapping[str, int], batch: int, transform: TransformCost,
                   input_layout: str, *, ct: int = 128, nt: int = 64, conv_layout: str = "NCHW",
                   wide_layout: str = "CHWN", output_layout: str | None = None) -> Assignment:
    """Seed 000's rule (section IV.A): a convolution with fewer than ``ct`` input channels, or any layer at a batch
    of ``nt`` or more, runs in ``wide_layout`` (CHWN), the rest in ``conv_layout``; layers without a channel count
    (pooling) prefer ``wide_layout``.  (Ct, Nt) = (128, 64) is the seed's GTX Titan X profile.  A layout a layer
    does not support falls back to one it does."""
    layouts: dict[str, str] = {}
    for n in nodes:
        c = channels.get(n.name)
        want = wide_layout if (c is None or c < ct or batch >= nt) else conv_layout
        layouts[n.name] = want if want in n.costs else min(n.costs, key=n.costs.get)  # type: ignore[arg-type]
    return evaluate(nodes, layouts, transform, input_layout, output_layout)


def choose_chain(nodes: Sequence[Node], transform: TransformCost, input_layout: str,
                 output_layout: str | None = None) -> Assignment:
    """The optimal assignment of a chain (each layer reads the previous one), by dynamic programming over
    (layer, layout): best[v][b] = cost(v, b) + min_a best[u][a] + transform(u, a, b) [a != b]."""
    _check(nodes)
    prev = INPUT
    best: dict[str, tuple[float, list[str]]] = {input_layout: (0.0, [])}
    for i, n in enumerate(nodes):
        if n.inputs != (prev,):
            raise InputError(f"layer {n.name!r} does not read only the previous layer: not a chain",
                             f"nodes[{i}].inputs")
        cur: dict[str, tuple[float, list[str]]] = {}
        for b, ms in sorted(n.costs.items()):
            cands = [(t + (transform(prev, a, b) if a != b else 0.0) + ms, path + [b]) for a, (t, path) in best.items()]
            cur[b] = min(cands, key=lambda c: c[0])
        best, prev = cur, n.name
    if output_layout is not None:
        best = {output_layout: min(((t + (transform(prev, a, output_layout) if a != output_layout else 0.0), p)
                                    for a, (t, p) in best.items()), key=lambda c: c[0])}
    _, path = min(best.values(), key=lambda c: c[0])
    return evaluate(nodes, {n.name: lay for n, lay in zip(nodes, path)}, transform, input_layout, output_layout)


def choose_layouts(nodes: Sequence[Node], transform: TransformCost, input_layout: str,
                   output_layout: str | None = None, *, time_limit: float | None = 10.0) -> Assignment:
    """The optimal assignment of any layer graph (nodes in topological order): :func:`choose_chain` on a chain,
    else an ILP (module doc).  :class:`~ucudnn.errors.InfeasibleError` if the solver finds no optimum."""
    _check(nodes)
    if all(n.inputs == ((INPUT,) if i == 0 else (nodes[i - 1].name,)) for i, n in enumerate(nodes)):
        return choose_chain(nodes, transform, input_layout, output_layout)
    import pulp

    prob = pulp.LpProblem("layouts", pulp.LpMinimize)
    new_var = getattr(prob, "add_variable", None) or (lambda name, lo, up, cat: pulp.LpVariable(name, lo, up, cat))
    x = {(n.name, b): new_var(f"x_{i}_{b}", 0, 1, pulp.LpBinary) for i, n in enumerate(nodes) for b in n.costs}
    layouts_of = {n.name: sorted(n.costs) for n in nodes}
    layouts_of[INPUT] = [input_layout]

    def placed(u: str, a: str):   # 1 if tensor u is produced in layout a
        return 1 if u == INPUT else x[(u, a)]

    consumers: dict[str, list[tuple[str, list[str]]]] = {}
    for n in nodes:
        prob += pulp.lpSum(x[(n.name, b)] for b in n.costs) == 1, f"one_{n.name}"
        for inp in n.inputs:
            consumers.setdefault(inp, []).append((n.name, sorted(n.costs)))
    y = {}
    for u, cons in consumers.items():
        for a in layouts_of[u]:
            for v, v_layouts in cons:
                for b in v_layouts:
                    if b == a:
                        continue
                    var = y.get((u, a, b))
                    if var is None:
                        var = y[(u, a, b)] = new_var(f"y_{len(y)}", 0, 1, pulp.LpContinuous)
                    prob += var >= placed(u, a) + x[(v, b)] - 1
    if output_layout is not None and nodes:
        last = nodes[-1].name
        for a in layouts_of[last]:
            if a != output_layout:
                var = y.get((last, a, output_layout))
                if var is None:
                    var = y[(last, a, output_layout)] = new_var(f"y_{len(y)}", 0, 1, pulp.LpContinuous)
                prob += var >= x[(last, a)]
    prob += (pulp.lpSum(n.costs[b] * x[(n.name, b)] for n in nodes for b in n.costs)
             + pulp.lpSum(transform(u, a, b) * var for (u, a, b), var in y.items()))
    from .wd import milp_backend

    prob.solve(milp_backend("auto", time_limit))
    if prob.sol_status != pulp.LpSolutionOptimal:
        raise InfeasibleError(f"layout choice: the solver ended {pulp.LpStatus[prob.status]}", None)
    layouts = {n.name: max(n.costs, key=lambda b: x[(n.name, b)].value() or 0.0) for n in nodes}
    return evaluate(nodes, layouts, transform, input_layout, output_layout)
