"""Pictures of plans: a kernel's desirable set (seed 003, Fig. 8) and the workspace division (Fig. 13).

matplotlib is optional (the ``plot`` extra) and imported only here, when a
picture is asked for.  Figures are drawn with matplotlib's object API
(``Figure``, no ``pyplot``): no global backend is switched, nothing opens a
window, and it works headless; ``savefig`` renders with Agg for PNG and the
vector backends for SVG / PDF.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence

from ..errors import InputError, UcudnnError
from .pareto import Configuration
from .plan import Plan

FORMATS = (".png", ".svg", ".pdf")
MiB = 1 << 20


class Point(Protocol):
    time_ms: float
    workspace_bytes: int


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UcudnnError("plots need matplotlib: pip install 'ucudnn[plot]'") from None
    return Figure(figsize=(width, height), layout="constrained")


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise InputError(f"unsupported picture format {path.suffix or '(none)'!r}; use {', '.join(FORMATS)}", "out")
    fig.savefig(path, dpi=150)
    return path


def plot_desirable(configs: Sequence[Configuration], path: str | Path, *, chosen: Point | None = None,
                   limit: int | None = None, title: str = "") -> Path:
    """Time vs workspace of a kernel's desirable configurations, the chosen one marked (Fig. 8).

    The staircase is the best time reachable at each workspace; each point is
    labelled with its division (``128x2 a4/FMA``: two micro-batches of 128 on algorithm 4).
    """
    if not configs:
        raise InputError("the kernel has no configuration to plot", "kernel")
    fig = _figure(8, 5)
    ax = fig.add_subplot()
    xs = [c.workspace_bytes / MiB for c in configs]
    ys = [c.time_ms for c in configs]
    ax.step(xs + [xs[-1] * 1.05 + 1e-3], ys + [ys[-1]], where="post", color="0.6", lw=1, zorder=1)
    ax.scatter(xs, ys, s=24, color="tab:blue", zorder=2, label=f"desirable configurations ({len(configs)})")
    if len(configs) <= 16:
        for c, x, y in zip(configs, xs, ys):
            ax.annotate(c.summary(), (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7, color="0.25")
    if chosen is not None:
        ax.scatter([chosen.workspace_bytes / MiB], [chosen.time_ms], s=160, marker="*", color="tab:red", zorder=3,
                   label=f"chosen: {chosen.time_ms:.3f} ms, {chosen.workspace_bytes / MiB:.1f} MiB")
    if limit is not None:
        ax.axvline(limit / MiB, color="tab:red", ls="--", lw=0.8, label=f"limit {limit / MiB:.1f} MiB")
    ax.set_xlabel("workspace (MiB)")
    ax.set_ylabel("time (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_division(plans: dict[str, Plan], path: str | Path, *, title: str = "") -> Path:
    """How each plan's workspace is divided among kernels: one horizontal bar per plan (Fig. 13).

    WD plans are drawn at their arena offsets out to the budget; per-kernel
    plans (WR, undivided) as one slot of the per-kernel limit per kernel, the
    part a kernel leaves unused hatched: the waste WD recovers.
    """
    if not plans:
        raise InputError("nothing to plot", "plans")
    from matplotlib import colormaps

    layers = list(dict.fromkeys(k.name.split("/")[0] for p in plans.values() for k in p.kernels))
    cmap = colormaps["tab20"]
    color = {layer: cmap(i % 20) for i, layer in enumerate(layers)}
    fig = _figure(10, 1.2 + 0.8 * len(plans))
    ax = fig.add_subplot()
    labels = []
    for row, (label, plan) in enumerate(plans.items()):
        wd = any(k.offset is not None for k in plan.kernels)
        start = 0
        for k in plan.kernels:
            layer = k.name.split("/")[0]
            left = k.offset if wd and k.offset is not None else start
            ax.barh(row, k.workspace_bytes / MiB, left=left / MiB, color=color[layer], edgecolor="white", lw=0.3)
            if not wd and plan.workspace_limit:
                unused = plan.workspace_limit - k.workspace_bytes
                ax.barh(row, unused / MiB, left=(left + k.workspace_bytes) / MiB, color="none",
                        edgecolor=color[layer], hatch="//", lw=0.3)
                start += plan.workspace_limit
        total = plan.total_workspace if wd else (plan.workspace_limit or 0) * len(plan.kernels)
        if total:
            ax.barh(row, total / MiB, color="none", edgecolor="0.3", lw=0.8)
        labels.append(f"{label}\n{plan.total_time_ms:.1f} ms")
    ax.set_yticks(range(len(plans)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("workspace (MiB)")
    ax.set_title(title, fontsize=10)
    from matplotlib.patches import Patch

    shown = layers[:20]  # beyond 20 layers colours repeat and a legend stops helping
    fig.legend(handles=[Patch(color=color[layer], label=layer) for layer in shown], fontsize=7,
               ncols=min(len(shown), 8), loc="outside lower center")
    return _save(fig, path)
