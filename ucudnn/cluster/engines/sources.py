"""Where a worker gets a unit's measurements: this GPU, or recorded real tables.

* :class:`GpuSource` benchmarks the unit on the worker's GPU with
  :func:`ucudnn.measure.benchmark`, exactly as the library does on a cache
  miss (same sources, repeat and numerics), so precomputed and on-demand
  measurements are interchangeable.
* :class:`ReplaySource` answers units from benchmark tables recorded on a real
  GPU.  ``ucudnn precompute --from-table`` uses it (no GPU needed), and tests
  use it to drive the whole pipeline, Ray included, on a CPU machine.

A source is pickled into every worker (a Ray actor or a pool process), so it
holds plain data and imports the GPU stack only inside its methods.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable, Protocol

from ... import source_names
from ...measure.sources.base import DEFAULT_REPEAT
from ...planning.table import BenchmarkTable, KernelBench, effective_numerics
from ...policy import channel_policy_of
from .base import Target, Unit, UnitError


class UnitSource(Protocol):
    name: str
    needs_gpu: bool  # True: each worker holds a whole GPU (never two benchmarks on one GPU)

    def probe(self) -> list[Target]:
        """The targets this worker can measure (called once in each worker, before any unit)."""
        ...

    def measure(self, unit: Unit) -> KernelBench:
        """The unit's measurements; raise (any exception) when there are none: the reason is reported."""
        ...


class GpuSource:
    """Benchmark on the worker's current GPU (the worker pins it via ``CUDA_VISIBLE_DEVICES``)."""

    name = "gpu"
    needs_gpu = True

    def __init__(self, repeat: int = DEFAULT_REPEAT, max_workspace: int | None = None):
        self.repeat = repeat
        self.max_workspace = max_workspace

    def probe(self) -> list[Target]:
        from ...binding import cudnn
        from ...binding.gpu import device_name

        return [Target(device_name(), cudnn.get_version())]

    def measure(self, unit: Unit) -> KernelBench:
        from ...measure.benchmarking import benchmark
        from ...problem import KernelSpec

        # the unit's channel policy, never the worker's environment: what is measured is what the key says
        table = benchmark([KernelSpec(unit.op, unit.op, unit.problem)], unit.batch_policy, unit.numerics,
                          sources=list(unit.sources), repeat=self.repeat, max_workspace=self.max_workspace,
                          progress=False, channel_policy=unit.channel_policy)
        if (table.device, table.cudnn_version) != (unit.target.device, unit.target.cudnn_version):
            raise UnitError(f"worker is a {table.device} / cuDNN {table.cudnn_version}, "
                            f"the unit needs {unit.target.device} / cuDNN {unit.target.cudnn_version}")
        kb = table.kernels[0]
        if not kb.measurements:  # a partial result is never stored as complete
            reasons = sorted({s.reason for s in kb.skipped})[:3]
            raise UnitError("no configuration could be measured: " + ("; ".join(reasons) or "no algorithm ran"))
        return kb


class ReplaySource:
    """Answer units from recorded tables: the measurements a GPU gave for the same (device, problem, op).

    ``time_scale`` > 0 sleeps ``benchmark_seconds * time_scale`` per unit, so a
    replayed job takes time in proportion to the real one (tests of progress,
    kill-and-resume and scheduling use it).  ``needs_gpu`` makes workers claim
    a GPU each as real ones do (Ray tests with logical GPUs).
    """

    name = "replay"

    def __init__(self, tables: Iterable[BenchmarkTable | str | Path], time_scale: float = 0.0,
                 needs_gpu: bool = False):
        tables = list(tables)
        self.tables = [t if isinstance(t, BenchmarkTable) else BenchmarkTable.load(t) for t in tables]
        # what reports call each table: its file name, or its network
        self.names = [str(t) if not isinstance(t, BenchmarkTable) else str(t.extra.get("network", f"table{i}"))
                      for i, t in enumerate(tables)]
        self.time_scale = time_scale
        self.needs_gpu = needs_gpu
        self._index: dict[tuple, KernelBench] | None = None

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["_index"] = None  # rebuilt in the worker
        return d

    def index(self) -> dict[tuple, KernelBench]:
        if self._index is None:
            idx: dict[tuple, KernelBench] = {}
            for t in self.tables:
                # a table without a numerics field answers units of the numerics it is taken to have
                nm, srcs = effective_numerics(t).numerics, source_names.of_table(t.extra)
                cp = channel_policy_of(t.extra)
                for k in t.kernels:
                    eff = source_names.effective(srcs, k.op, k.problem)   # as the unit's key names them
                    idx.setdefault((t.device, t.cudnn_version, nm, eff, cp, k.problem, k.op), k)
                    if cp != "none":   # its whole-k rows answer a unit without slices as well
                        idx.setdefault((t.device, t.cudnn_version, nm, eff, "none", k.problem, k.op),
                                       KernelBench(k.name, k.op, k.problem,
                                                   [m for m in k.measurements if m.channels is None],
                                                   k.skipped, k.benchmark_seconds))
            self._index = idx
        return self._index

    def probe(self) -> list[Target]:
        return sorted({Target(t.device, t.cudnn_version) for t in self.tables}, key=lambda t: (t.device, t.cudnn_version))

    def lookup(self, unit: Unit) -> KernelBench | None:
        """The recorded kernel for ``unit`` (any micro-batch sizes), or None."""
        return self.index().get((unit.target.device, unit.target.cudnn_version, unit.numerics,
                                 source_names.effective(unit.sources, unit.op, unit.problem), unit.channel_policy,
                                 unit.problem, unit.op))

    def measure(self, unit: Unit) -> KernelBench:
        kb = self.lookup(unit)
        if kb is None:
            sliced = f" (channel policy {unit.channel_policy})" if unit.channel_policy != "none" else ""
            raise UnitError(f"no recorded measurements of {unit.label()} with numerics {unit.numerics} and sources "
                            f"{','.join(unit.sources)}{sliced} on {unit.target.device} / cuDNN "
                            f"{unit.target.cudnn_version}")
        want = set(unit.micro_batches)
        missing = sorted(want - set(kb.micro_batches()) - {s.micro_batch for s in kb.skipped})
        if missing:
            raise UnitError(f"the recorded table has no measurements at micro-batch sizes {missing[:8]}"
                            f"{' ...' if len(missing) > 8 else ''} (batch policy {unit.batch_policy})")
        if self.time_scale > 0 and kb.benchmark_seconds:
            time.sleep(kb.benchmark_seconds * self.time_scale)
        return KernelBench(unit.op, unit.op, unit.problem, [m for m in kb.measurements if m.micro_batch in want],
                           [s for s in kb.skipped if s.micro_batch in want], kb.benchmark_seconds)
