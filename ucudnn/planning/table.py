"""Benchmark tables: what was measured, on which device and cuDNN version.

``ucudnn-benchmark-table/1`` is the one interchange format between the
measurement layer (GPU), the planners (pure Python), the plan service and the
cluster tools.  Its JSON Schema is ``ucudnn/schemas/benchmark-table.schema.json``.
Loading validates structure against that schema and then the semantics the
schema cannot express (finite numbers, known ops), always naming the field.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple

from .. import numerics as num
from ..errors import InputError, TableError
from ..problem import ConvProblem
from ..schemas import validate

FORMAT = "ucudnn-benchmark-table/1"


@dataclass(frozen=True)
class Measurement:
    """One micro-configuration option: run ``algo`` under ``math_type`` on ``micro_batch`` samples.

    ``channels``: the option computes only that many of the kernel's output channels (a channel slice, issue 18:
    FFT / Winograd workspace scales with channels, so slicing K shrinks it where slicing N cannot); None: all.
    """

    micro_batch: int
    algo: int | str
    math_type: str
    time_ms: float
    workspace_bytes: int
    source: str = "legacy"
    engine: Any = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    channels: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.extra)
        d.update(micro_batch=self.micro_batch, algo=self.algo, math_type=self.math_type,
                 time_ms=self.time_ms, workspace_bytes=self.workspace_bytes)
        if self.channels is not None:
            d["channels"] = self.channels
        if self.source != "legacy":
            d["source"] = self.source
        if self.engine is not None:
            d["engine"] = self.engine
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Measurement":
        known = {"micro_batch", "algo", "math_type", "time_ms", "workspace_bytes", "source", "engine", "channels"}
        return cls(micro_batch=d["micro_batch"], algo=d["algo"], math_type=d["math_type"],
                   time_ms=float(d["time_ms"]), workspace_bytes=int(d["workspace_bytes"]),
                   source=d.get("source", "legacy"), engine=d.get("engine"),
                   extra={k: v for k, v in d.items() if k not in known}, channels=d.get("channels"))


@dataclass(frozen=True)
class Skipped:
    """An algorithm that could not be measured, and why (unsupported, out of memory, ...)."""

    micro_batch: int
    algo: int | str | None
    math_type: str | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"micro_batch": self.micro_batch, "algo": self.algo, "math_type": self.math_type, "reason": self.reason}


@dataclass
class KernelBench:
    """All measurements of one kernel: a problem and an op."""

    name: str
    op: str
    problem: ConvProblem
    measurements: list[Measurement]
    skipped: list[Skipped] = field(default_factory=list)
    benchmark_seconds: float | None = None

    def micro_batches(self) -> list[int]:
        return sorted({m.micro_batch for m in self.measurements})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KernelBench":
        """From already-validated JSON (see :meth:`BenchmarkTable.from_dict`, which validates)."""
        return cls(d["name"], d["op"], ConvProblem.from_dict(d["problem"]),
                   [Measurement.from_dict(m) for m in d["measurements"]],
                   [Skipped(s["micro_batch"], s.get("algo"), s.get("math_type"), s["reason"]) for s in d.get("skipped", [])],
                   d.get("benchmark_seconds"))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "op": self.op, "problem": self.problem.to_dict(),
                             "measurements": [m.to_dict() for m in self.measurements]}
        if self.skipped:
            d["skipped"] = [s.to_dict() for s in self.skipped]
        if self.benchmark_seconds is not None:
            d["benchmark_seconds"] = round(self.benchmark_seconds, 6)
        return d


@dataclass
class BenchmarkTable:
    device: str
    cudnn_version: int
    kernels: list[KernelBench]
    numerics: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # -- interchange -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"format": FORMAT, "device": self.device, "cudnn_version": self.cudnn_version}
        if self.numerics is not None:
            d["numerics"] = self.numerics
        d.update({k: v for k, v in self.extra.items() if k not in d and k != "kernels"})
        d["kernels"] = [k.to_dict() for k in self.kernels]
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def content_id(self) -> str:
        """Content hash: the same measurements give the same id (the store is idempotent on it).

        Hashed with the numerics the table is taken to have (:func:`effective_numerics`), so a table
        without the field and the same table with it spelled out are one table, with one id.
        """
        return hashlib.sha256(json.dumps(self.resolved().to_dict(), sort_keys=True).encode()).hexdigest()[:24]

    def resolved(self) -> "BenchmarkTable":
        """This table with its ``numerics`` field filled in (:func:`effective_numerics`); itself when it has one."""
        if self.numerics is not None:
            return self
        return BenchmarkTable(self.device, self.cudnn_version, self.kernels, effective_numerics(self).numerics,
                              dict(self.extra))

    @classmethod
    def from_dict(cls, doc: Any) -> "BenchmarkTable":
        if not isinstance(doc, dict):
            raise TableError(f"expected a JSON object, got {type(doc).__name__}", "(document)")
        if doc.get("format") != FORMAT:
            raise TableError(f"expected {FORMAT!r}, got {doc.get('format')!r}", "format")
        validate(doc, FORMAT, TableError)
        kernels: list[KernelBench] = []
        names: set[str] = set()
        for i, kd in enumerate(doc["kernels"]):
            where = f"kernels[{i}]"
            if kd["name"] in names:
                raise TableError(f"duplicate kernel name {kd['name']!r}", f"{where}.name")
            names.add(kd["name"])
            try:
                problem = ConvProblem.from_dict(kd["problem"], f"{where}.problem")
            except InputError as e:
                raise TableError(str(e).split(": ", 1)[-1], e.field) from None
            for j, md in enumerate(kd["measurements"]):
                if not math.isfinite(md["time_ms"]):
                    raise TableError(f"must be a finite positive number, got {md['time_ms']!r}",
                                     f"{where}.measurements[{j}].time_ms")
                if md["micro_batch"] > problem.n:
                    raise TableError(f"micro-batch {md['micro_batch']} exceeds the mini-batch n={problem.n}",
                                     f"{where}.measurements[{j}].micro_batch")
                ch = md.get("channels")
                if ch is not None and (ch >= problem.k or problem.groups != 1):
                    raise TableError(f"a channel slice must be fewer than k={problem.k} channels of an ungrouped "
                                     f"convolution, got {ch}", f"{where}.measurements[{j}].channels")
            bs = kd.get("benchmark_seconds")
            if bs is not None and not math.isfinite(bs):
                raise TableError(f"must be a finite number, got {bs!r}", f"{where}.benchmark_seconds")
            kernels.append(KernelBench.from_dict(kd))
        extra = {k: v for k, v in doc.items() if k not in ("format", "device", "cudnn_version", "numerics", "kernels")}
        return cls(doc["device"], doc["cudnn_version"], kernels, doc.get("numerics"), extra)

    @classmethod
    def loads(cls, text: str | bytes) -> "BenchmarkTable":
        try:
            doc = json.loads(text, parse_constant=_refuse_constant)
        except json.JSONDecodeError as e:
            raise TableError(f"not valid JSON: {e}", "(document)") from None
        return cls.from_dict(doc)

    @classmethod
    def load(cls, path: str | Path) -> "BenchmarkTable":
        """Load ``path``; ``builtin:NAME`` loads a table shipped with ucudnn (see :func:`builtin_tables`)."""
        path = str(path)
        if path.startswith("builtin:"):
            name = path.removeprefix("builtin:")
            root = resources.files("ucudnn.data.tables")
            for suffix in (".json", ".json.gz"):
                res = root.joinpath(name + suffix)
                if res.is_file():
                    raw = res.read_bytes()
                    return cls.loads(gzip.decompress(raw) if suffix.endswith(".gz") else raw)
            raise TableError(f"no shipped table {name!r}; shipped: {', '.join(builtin_tables())}", "table")
        try:
            raw = Path(path).read_bytes()
            text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
        except (OSError, UnicodeDecodeError, gzip.BadGzipFile) as e:
            raise TableError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}", "table") from None
        return cls.loads(text)

    def save(self, path: str | Path) -> None:
        """Write JSON; a path ending in ``.gz`` is gzip-compressed (``all``-policy tables are large)."""
        text = (self.to_json(indent=None if str(path).endswith(".gz") else 1) + "\n").encode()
        Path(path).write_bytes(gzip.compress(text, mtime=0) if str(path).endswith(".gz") else text)

    # -- queries -----------------------------------------------------------
    def kernel(self, name: str) -> KernelBench:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)

    def restricted(self, math_types: Iterable[str], numerics: str | None = None) -> "BenchmarkTable":
        """The same table keeping only measurements under ``math_types`` (e.g. what a DEFAULT-math caller gets)."""
        keep = set(math_types)
        return self.filtered(lambda k, m: m.math_type in keep, numerics)

    def filtered(self, keep: Callable[[KernelBench, Measurement], bool],
                 numerics: str | None = None) -> "BenchmarkTable":
        """The same table keeping the measurements ``keep(kernel, measurement)`` accepts: what a benchmark that
        never measured the others would have recorded (e.g. a source or a fold layout left out)."""
        kernels = [KernelBench(k.name, k.op, k.problem, [m for m in k.measurements if keep(k, m)],
                               k.skipped, k.benchmark_seconds) for k in self.kernels]
        return BenchmarkTable(self.device, self.cudnn_version, kernels, numerics or self.numerics, dict(self.extra))

    @staticmethod
    def merge(tables: Iterable["BenchmarkTable"]) -> "BenchmarkTable":
        """Concatenate tables of one device, cuDNN version and numerics (refuses to mix them).

        The result always has its numerics (:func:`effective_numerics`): tables without the field are
        merged as one such table (taken as what the union of their measurements is), a mix is compared
        by the numerics each is taken to have.
        """
        tables = list(tables)
        first = tables[0]
        spelled = any(t.numerics is not None for t in tables)
        nm = [effective_numerics(t).numerics if spelled else None for t in tables]
        kernels: list[KernelBench] = []
        for t, n in zip(tables, nm):
            if (t.device, t.cudnn_version, n) != (first.device, first.cudnn_version, nm[0]):
                raise TableError(f"cannot merge a table of {t.device} / cuDNN {t.cudnn_version} / {n} "
                                 f"with one of {first.device} / cuDNN {first.cudnn_version} / {nm[0]}", "device")
            kernels.extend(t.kernels)
        return BenchmarkTable(first.device, first.cudnn_version, kernels, nm[0], dict(first.extra)).resolved()


class EffectiveNumerics(NamedTuple):
    """The numerics a table's measurements were made under, and, when the table does not say, how it was taken."""

    numerics: str
    note: str | None  # None: the table's own field; else "no numerics field; taken as strict (float32 default)"


def effective_numerics(table: BenchmarkTable) -> EffectiveNumerics:
    """The numerics ``table`` is taken to have: its ``numerics`` field, or the rule for tables without one.

    ``ucudnn-benchmark-table/1`` was first specified without the field.  Such a table is taken to have its
    dtype's default numerics (``strict`` for float32, ``default`` for float16 / bfloat16) when every math type
    it records is allowed under it, and otherwise the narrowest numerics that allows them all
    (:func:`ucudnn.numerics.inferred`: an FP32 table with TENSOR_OP rows is ``tf32``).  Its rows are never
    filtered, so precompute, bundles and the plan service plan exactly the rows ``ucudnn plan --from-table``
    plans; the numerics only labels the plans and keys the units, and never claims stricter math than was
    recorded.  A math type cuDNN does not have makes it ``default``, the one mode that claims nothing.
    """
    if table.numerics is not None:
        return EffectiveNumerics(table.numerics, None)
    per_dtype: dict[str, set[str]] = {}
    for k in table.kernels:
        per_dtype.setdefault(k.problem.dtype, set()).update(m.math_type for m in k.measurements)
    per_dtype = per_dtype or {"float32": set()}
    modes = {dtype: num.inferred(dtype, seen) for dtype, seen in per_dtype.items()}
    unknown = sorted(dtype for dtype, mode in modes.items() if mode is None)
    if unknown:
        mode = "default"
        odd = sorted({m for d in unknown for m in per_dtype[d] if num.inferred(d, [m]) is None})
        why = f"math types {', '.join(odd)} are not cuDNN's; default is the one numerics that claims nothing"
    else:
        mode = max(modes.values(), key=num.MODES.index)  # type: ignore[arg-type]
        defaults = {dtype: num.normalize(None, dtype) for dtype in per_dtype}
        if all(defaults[d] == mode for d in per_dtype):
            why = " and ".join(sorted(per_dtype)) + " default"
        else:
            recorded = sorted({m for seen in per_dtype.values() for m in seen})
            why = (f"the narrowest numerics allowing the math types recorded ({', '.join(recorded)}) for "
                   f"{' and '.join(sorted(per_dtype))} data")
    return EffectiveNumerics(mode, f"no numerics field; taken as {mode} ({why})")


def _refuse_constant(name: str) -> float:
    # Python's json accepts NaN / Infinity, JSON does not: a table carrying them is malformed
    raise TableError(f"{name} is not a JSON number", "(document)")


def builtin_tables() -> list[str]:
    """Names of the real benchmark tables shipped in ``ucudnn/data/tables``."""
    root = resources.files("ucudnn.data.tables")
    return sorted(p.name.removesuffix(".gz").removesuffix(".json") for p in root.iterdir()
                  if p.name.endswith((".json", ".json.gz")))
