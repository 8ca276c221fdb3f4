"""Module paths from before the layer packages keep importing, as the very modules they moved to.

0.1 kept 28 modules flat in ``ucudnn/``; they now live in the folder of their
layer (README, "Architecture").  Users' scripts import the old paths
(``from ucudnn.table import BenchmarkTable``, ``import ucudnn.sources.graph``),
so a meta-path finder answers them with the new module object itself: one
module, one set of globals, so ``isinstance`` checks and monkeypatching see the
same thing under both names.  Each old path warns once (DeprecationWarning).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old path -> new path (the README's changelog lists them)
MOVED = {
    "ucudnn.cudnn": "ucudnn.binding.cudnn",
    "ucudnn.gpu": "ucudnn.binding.gpu",
    "ucudnn.timing": "ucudnn.binding.timing",
    "ucudnn.sources": "ucudnn.measure.sources",
    "ucudnn.sources.base": "ucudnn.measure.sources.base",
    "ucudnn.sources.registry": "ucudnn.measure.sources.registry",
    "ucudnn.sources.legacy": "ucudnn.measure.sources.legacy",
    "ucudnn.sources.graph": "ucudnn.measure.sources.graph",
    "ucudnn.sources.relayout": "ucudnn.measure.sources.relayout",
    "ucudnn.sources.fold": "ucudnn.measure.sources.fold",
    "ucudnn.table": "ucudnn.planning.table",
    "ucudnn.plan": "ucudnn.planning.plan",
    "ucudnn.wr": "ucudnn.planning.wr",
    "ucudnn.pareto": "ucudnn.planning.pareto",
    "ucudnn.wd": "ucudnn.planning.wd",
    "ucudnn.arena": "ucudnn.planning.arena",
    "ucudnn.planner": "ucudnn.planning.planner",
    "ucudnn.network": "ucudnn.planning.network",
    "ucudnn.plots": "ucudnn.planning.plots",
    "ucudnn.store": "ucudnn.catalog.store",
    "ucudnn.bundle": "ucudnn.catalog.bundle",
    "ucudnn.lookup": "ucudnn.catalog.lookup",
    "ucudnn.client": "ucudnn.catalog.client",
    "ucudnn.precompute": "ucudnn.cluster.precompute",
    "ucudnn.engines": "ucudnn.cluster.engines",
    "ucudnn.engines.base": "ucudnn.cluster.engines.base",
    "ucudnn.engines.local": "ucudnn.cluster.engines.local",
    "ucudnn.engines.ray_engine": "ucudnn.cluster.engines.ray_engine",
    "ucudnn.engines.sources": "ucudnn.cluster.engines.sources",
}


def new_name(old: str) -> str | None:
    """Where ``old`` lives now, also for modules inside a moved package (``ucudnn.sources.wrapper``)."""
    parts = old.split(".")
    for i in range(len(parts), 1, -1):
        new = MOVED.get(".".join(parts[:i]))
        if new is not None:
            return ".".join([new, *parts[i:]])
    return None


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = new_name(spec.name)
        warnings.warn(f"{spec.name} moved to {new}; the old path keeps working for now", DeprecationWarning,
                      stacklevel=2)
        module = importlib.import_module(new)
        self._spec = module.__spec__          # the import system overwrites __spec__; exec_module restores it
        return module

    def exec_module(self, module):
        module.__spec__ = self._spec


def install() -> None:
    """Put the finder on ``sys.meta_path`` once; alias what ``ucudnn/__init__`` imported already."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        # first: the path finder would load a second copy of a moved package's modules under the old name
        sys.meta_path.insert(0, _MovedFinder())
    # ``ucudnn.plan`` is also the planning function: importing the old module path later must not rebind it
    sys.modules.setdefault("ucudnn.plan", importlib.import_module("ucudnn.planning.plan"))
