"""Precompute jobs: measure every unit a cluster's networks need once, then plan them all.

    ucudnn precompute --network alexnet@256 --network resnet50@128 --dtype float32,float16 \\
        --workspace-limits 8MiB,64MiB --total-workspaces 1GiB --engine ray --out plans.bundle
    ucudnn precompute --job job.yaml --engine ray --address auto --store postgresql+psycopg://...

A job (:class:`JobSpec`: flags or a YAML/JSON file, schema
``ucudnn/schemas/precompute-job.schema.json``) names networks at batch sizes,
dtypes, layouts and numerics, or recorded tables; a batch policy; per-kernel
limits (WR) and whole-network budgets (WD).  It runs in three steps:

1. **Units.**  Every (GPU model, cuDNN version, problem, op, numerics, batch
   policy) the requests need, once: the same convolution in two networks or
   in two layers is one unit.  A unit the store already holds (its
   ``kernel_benches`` row, under the library's own cache key) is skipped, so
   a killed job restarted with the same store measures only what is missing,
   and the library finds every measured unit as a cache hit.
2. **Measurement** on an engine's workers (:mod:`ucudnn.cluster.engines`: local
   processes or Ray actors, one per GPU), longest units first, retried on
   failure, each stored the moment it arrives.
3. **Tables and plans.**  Each request becomes a benchmark table the moment
   its last unit is measured, and is planned with WR under every limit and
   WD under every budget as CPU tasks while the GPUs measure the other
   requests: only the last request's planning follows the measurement.  A
   request with a failed unit is reported incomplete and stores no table
   (nothing partial looks complete).  Plans are stored
   under the plan service's own key (table id, policy, sizes), so a service
   on the same store, or one that imported the bundle, answers them at once.

The store is ``--store``, else the ``--out`` bundle itself, else the user
cache.  The result is a JSON summary (:func:`run_job`).
"""
from __future__ import annotations

import json
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .. import numerics as num
from .. import source_names
from ..catalog.store import Store
from ..config import DEFAULT_BATCH_POLICY
from ..errors import InputError
from ..measure.sources.base import DEFAULT_REPEAT
from ..planning.table import BenchmarkTable, KernelBench, effective_numerics
from ..policy import channel_policy_of, key_policy_of, normalize_channel_policy, normalize_policy
from ..problem import DTYPES, LAYOUTS, OPS
from ..schemas import validate
from ..units import parse_size
from .engines import Engine, GpuSource, PlanTask, ReplaySource, Target, Unit, UnitOutcome, dispatch
from .engines.sources import UnitSource

if TYPE_CHECKING:
    from ..planning.network import Network

SCHEMA = "precompute-job.schema.json"
PLAN_TASK_SIZE = 6  # (table, limit) plans per CPU task
PLAN_KEY_VERSION = 2  # ucudnn.server.planning.KEY_VERSION: plans are stored under the service's key


@dataclass
class NetworkRequest:
    """A network (shipped name or ``ucudnn-network/1`` file) at some batch sizes (None: its default).

    A ``--torch-model`` is a request whose network was traced from a PyTorch factory (:func:`torch_model`):
    ``built`` holds it, ``network`` names the factory, ``input_shape`` is what it was traced at.
    """

    network: str
    batch_sizes: list[int] | None = None
    built: "Network | None" = field(default=None, repr=False, compare=False)
    input_shape: tuple[int, int, int] | None = None

    def load(self) -> "Network":
        """The network: the traced one, else the shipped name or file."""
        if self.built is not None:
            return self.built
        from ..planning.network import load_network

        return load_network(self.network)

    @classmethod
    def parse(cls, text: str, field: str) -> "NetworkRequest":
        """``alexnet``, ``alexnet@256`` or ``resnet50@64,128``."""
        name, sep, batches = text.rpartition("@")
        if not sep or not batches.replace(",", "").strip().isdigit():
            return cls(text)
        try:
            sizes = [int(b) for b in batches.split(",") if b.strip()]
        except ValueError:
            raise InputError(f"expected NAME@BATCH[,BATCH...], got {text!r}", field) from None
        if not sizes or min(sizes) < 1:
            raise InputError(f"batch sizes must be positive, got {text!r}", field)
        return cls(name, sizes)


@dataclass
class JobSpec:
    """What to precompute.  Sizes are bytes; lists are crossed (networks x batches x dtypes x layouts x numerics)."""

    networks: list[NetworkRequest] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    batch_sizes: list[int] | None = None
    dtypes: list[str] = field(default_factory=lambda: ["float32"])
    layouts: list[str] = field(default_factory=lambda: ["NCHW"])
    numerics: list[str | None] = field(default_factory=lambda: [None])
    ops: list[str] = field(default_factory=lambda: list(OPS))
    batch_policy: str = DEFAULT_BATCH_POLICY    # the jobs' default, so their keys find what this stores
    workspace_limits: list[int] = field(default_factory=list)
    total_workspaces: list[int] = field(default_factory=list)
    gpu_models: list[str] | None = None
    repeat: int = DEFAULT_REPEAT
    max_retries: int = 2
    #: algorithm sources to measure with (None: the library's default, resolved where the job is planned)
    sources: list[str] | None = None
    #: channel slices to measure besides micro-batches (None: ``UCUDNN_CHANNEL_POLICY``, else none), recorded in
    #: every unit's key as the library's lookups key them, so a bundle made with ``halves`` answers jobs that run
    #: with ``UCUDNN_CHANNEL_POLICY=halves``
    channel_policy: str | None = None

    def channel_policy_now(self) -> str:
        """The channel policy this job measures: its own, else the environment's
        (:func:`ucudnn.config.channel_policy`)."""
        from ..config import channel_policy

        return self.channel_policy if self.channel_policy is not None else channel_policy()

    @classmethod
    def from_dict(cls, doc: Any, where: str = "job") -> "JobSpec":
        """A job file's content; every error names the field (``job.workspace_limits[1]``)."""
        validate(doc, SCHEMA, InputError)
        spec = cls()
        for i, n in enumerate(doc.get("networks", [])):
            if isinstance(n, str):
                spec.networks.append(NetworkRequest.parse(n, f"{where}.networks[{i}]"))
            elif "torch_model" in n:
                req = torch_model(n["torch_model"], n["input_shape"], f"{where}.networks[{i}].torch_model")
                spec.networks.append(NetworkRequest(req.network, n.get("batch_sizes", req.batch_sizes),
                                                    built=req.built, input_shape=req.input_shape))
            else:
                spec.networks.append(NetworkRequest(n["name"], n.get("batch_sizes")))
        spec.tables = list(doc.get("tables", []))
        spec.batch_sizes = doc.get("batch_sizes")
        for key in ("dtypes", "layouts", "numerics", "ops", "gpu_models"):
            if key in doc:
                setattr(spec, key, list(doc[key]))
        spec.batch_policy = normalize_policy(doc.get("batch_policy", spec.batch_policy), f"{where}.batch_policy")
        if doc.get("channel_policy") is not None:
            spec.channel_policy = normalize_channel_policy(doc["channel_policy"], f"{where}.channel_policy")
        for key in ("workspace_limits", "total_workspaces"):
            setattr(spec, key, [parse_size(v, f"{where}.{key}[{i}]", allow_zero=False)
                                for i, v in enumerate(doc.get(key, []))])
        spec.repeat = int(doc.get("repeat", spec.repeat))
        spec.max_retries = int(doc.get("max_retries", spec.max_retries))
        if doc.get("sources") is not None:
            spec.sources = list(source_names.canonical(doc["sources"], f"{where}.sources"))
        spec.check(where)
        return spec

    @classmethod
    def load(cls, path: str | Path) -> "JobSpec":
        """A YAML (``.yaml``/``.yml``) or JSON job file."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise InputError(f"cannot read {p}: {e.strerror or e}", "--job") from None
        try:
            if p.suffix.lower() in (".yaml", ".yml"):
                import yaml

                doc = yaml.safe_load(text)
            else:
                doc = json.loads(text)
        except Exception as e:  # noqa: BLE001 - yaml.YAMLError / JSONDecodeError: both are bad input
            raise InputError(f"not valid {'YAML' if p.suffix.lower() in ('.yaml', '.yml') else 'JSON'}: {e}",
                             "--job") from None
        return cls.from_dict(doc if doc is not None else {}, "job")

    def check(self, where: str = "job") -> None:
        """Semantics the schema cannot say; raises InputError naming the field."""
        if not self.networks and not self.tables:
            raise InputError("name at least one network or table to precompute", f"{where}.networks")
        for key, allowed in (("dtypes", DTYPES), ("layouts", LAYOUTS), ("ops", OPS)):
            for i, v in enumerate(getattr(self, key)):
                if v not in allowed:
                    raise InputError(f"must be one of {', '.join(allowed)}, got {v!r}", f"{where}.{key}[{i}]")
        for i, v in enumerate(self.numerics):
            if v is not None:
                num.normalize(v)
        if self.repeat < 0:
            raise InputError("must not be negative", f"{where}.repeat")
        if self.max_retries < 0:
            raise InputError("must not be negative", f"{where}.max_retries")

    def to_dict(self) -> dict[str, Any]:
        """The job as a job file (:data:`SCHEMA`): ``from_dict(spec.to_dict())`` is the same job.  Fields left to
        their defaults by None (batch sizes, GPU models, sources, channel policy) are left out, as a file would; a
        traced model is written as its factory and input shape, traced again when read."""
        def network(n: NetworkRequest) -> dict[str, Any]:
            doc: dict[str, Any] = ({"torch_model": n.network, "input_shape": list(n.input_shape)}
                                   if n.input_shape is not None else {"name": n.network})
            return doc | ({"batch_sizes": list(n.batch_sizes)} if n.batch_sizes else {})

        doc = {"networks": [network(n) for n in self.networks],
               "tables": self.tables, "batch_sizes": self.batch_sizes, "dtypes": self.dtypes,
               "layouts": self.layouts, "numerics": self.numerics, "ops": self.ops,
               "batch_policy": self.batch_policy, "workspace_limits": self.workspace_limits,
               "total_workspaces": self.total_workspaces, "gpu_models": self.gpu_models,
               "repeat": self.repeat, "max_retries": self.max_retries, "sources": self.sources,
               "channel_policy": self.channel_policy}
        return {k: v for k, v in doc.items() if v is not None}


@dataclass
class TableRequest:
    """One benchmark table to assemble from units: a network instance, or a recorded table re-measured."""

    name: str
    target: Target
    numerics: str
    kernels: list[tuple[str, Unit]]          # (kernel name in the table, its unit)
    extra: dict[str, Any]
    numerics_note: str | None = None         # a recorded table without the field: what it was taken as


def expand(spec: JobSpec, targets: Sequence[Target],
           recorded: Sequence[tuple[str, BenchmarkTable]] = ()) -> list[TableRequest]:
    """Table requests for every target: each network instance, else each recorded table as it is.

    With networks, recorded tables only supply measurements (the replay
    source); without, each recorded table is itself a request, on its own
    device and cuDNN version, so its plans are made from exactly its rows.
    """
    bp = spec.batch_policy
    out: list[TableRequest] = []
    if spec.networks:
        srcs = source_names.canonical(spec.sources, "sources")
        cp = spec.channel_policy_now()
        sliced = {"channel_policy": cp} if cp != "none" else {}
        for i, req in enumerate(spec.networks):
            net = req.load()
            for batch in req.batch_sizes or spec.batch_sizes or [net.default_batch]:
                for dtype in spec.dtypes:
                    for layout in spec.layouts:
                        for nm_req in spec.numerics:
                            nm = num.normalize(nm_req, dtype)
                            specs = net.kernels(batch, dtype, layout, spec.ops)
                            for t in targets:
                                name = f"{net.name}-b{batch}-{dtype}-{layout}-{nm}"
                                out.append(TableRequest(
                                    name, t, nm, [(s.name, Unit(t, s.problem, s.op, nm, bp, srcs, cp))
                                                  for s in specs],
                                    {"batch_policy": bp, "network": net.name, "precompute": name,
                                     "sources": list(srcs), **sliced}))
        return out
    for name, t in recorded:
        target = Target(t.device, t.cudnn_version)
        nm, note = effective_numerics(t)
        out.append(TableRequest(name, target, nm, [(k.name, Unit(target, k.problem, k.op, nm, bp,
                                                                 source_names.of_table(t.extra),
                                                                 channel_policy_of(t.extra)))
                                                   for k in t.kernels if k.op in spec.ops], dict(t.extra), note))
    return out


def plan_key(table_id: str, policy: str, batch_policy: str, size: int) -> dict[str, Any]:
    """The plan service's key for a stored table's plan (``PlanService.key``): a shared store answers it."""
    if policy == "undivided":
        batch_policy = "undivided"
    return {"service": PLAN_KEY_VERSION, "table_id": table_id, "policy": policy, "batch_policy": batch_policy,
            "workspace_limit": None if policy == "wd" else size, "total_workspace": size if policy == "wd" else None}


class JobProgress:
    """Units done / total per GPU model with rate and ETA, then planning, on stderr (rich), when enabled."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._p: Any = None
        self._tasks: dict[Target, Any] = {}
        self._plan_task: Any = None

    def start(self, totals: dict[Target, tuple[int, int]]) -> None:
        """``totals``: target -> (units to measure, units already stored)."""
        if not self.enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.text import Text

        class Rate(ProgressColumn):
            def render(self, task: Any) -> Text:
                return Text(f"{task.speed:.2f}/s" if task.speed else "  -  /s", style="progress.data.speed")

        self._p = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), Rate(),
                           TextColumn("{task.fields[note]}"), TimeElapsedColumn(), TextColumn("ETA"),
                           TimeRemainingColumn(), console=Console(stderr=True))
        self._p.start()
        for t, (todo, skipped) in totals.items():
            self._tasks[t] = self._p.add_task(t.label(), total=todo, note=f"({skipped} stored)" if skipped else "")

    def advance(self, o: UnitOutcome) -> None:
        if self._p is not None and o.unit.target in self._tasks:
            task = self._tasks[o.unit.target]
            failed = self._p.tasks[task].fields.get("failed", 0) + (o.status == "failed")
            self._p.update(task, advance=1, failed=failed, note=f"{failed} failed" if failed else "")

    def planning(self, total: int) -> None:
        if self._p is not None:
            self._plan_task = self._p.add_task("planning (CPU)", total=total, note="")

    def planned(self, n: int) -> None:
        if self._p is not None and self._plan_task is not None:
            self._p.update(self._plan_task, advance=n)

    def stop(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None


def default_source(spec: JobSpec) -> UnitSource:
    """Recorded tables replay (no GPU); else this cluster's GPUs."""
    return ReplaySource(spec.tables) if spec.tables else GpuSource(repeat=spec.repeat)


def replay_notes(source: UnitSource) -> dict[str, str]:
    """``{table name: note}`` for a replay source's tables without a numerics field: what each is taken as
    (``effective_numerics``; the source answers units of that numerics from it)."""
    if not isinstance(source, ReplaySource):
        return {}
    return {name: note for name, t in zip(source.names, source.tables)
            if (note := effective_numerics(t).note) is not None}


def run_job(spec: JobSpec, engine: Engine, store: Store, *, source: UnitSource | None = None,
            progress: JobProgress | None = None) -> dict[str, Any]:
    """Run ``spec`` on ``engine`` into ``store``; the JSON summary.  The caller closes the engine."""
    t_start = time.perf_counter()
    progress = progress or JobProgress(False)
    source = source or default_source(spec)
    notes = replay_notes(source)
    workers = engine.start(source)
    startup_s = time.perf_counter() - t_start
    targets: list[Target] = []
    for w in workers:
        targets += [t for t in w.targets if t not in targets]
    recorded: list[tuple[str, BenchmarkTable]] = []
    if not spec.networks:  # the recorded tables are the requests (loaded once when the source holds them)
        have = dict(zip(source.names, source.tables)) if isinstance(source, ReplaySource) else {}
        recorded = [(p, have.get(p) or BenchmarkTable.load(p)) for p in spec.tables]
        for p, t in recorded:
            note = effective_numerics(t).note
            if note is not None:
                notes.setdefault(p, note)
    requests = expand(spec, targets, recorded)
    for r in requests:
        r.numerics_note = r.numerics_note or notes.get(r.name)
    if spec.gpu_models:
        models = {m.lower() for m in spec.gpu_models}
        requests = [r for r in requests if r.target.accelerator_type.lower() in models or r.target.device.lower() in models]

    # 1. units, deduplicated across requests; those the store holds are skipped
    units: dict[str, Unit] = {}
    kernels_requested = 0
    for r in requests:
        kernels_requested += len(r.kernels)
        for _, u in r.kernels:
            units.setdefault(u.id, u)
    benches: dict[str, KernelBench] = {}
    for uid, u in units.items():
        kb = store.get_kernel_bench(u.key())
        if kb is not None:
            benches[uid] = kb
    todo = [u for uid, u in units.items() if uid not in benches]
    totals: dict[Target, tuple[int, int]] = {}
    for u in units.values():
        todo_n, skip_n = totals.get(u.target, (0, 0))
        totals[u.target] = (todo_n + (u.id not in benches), skip_n + (u.id in benches))

    # 2. measurement, and 3. tables and plans as soon as a request's units are all in: planning (CPU)
    # overlaps the GPUs measuring the other requests, so only the last request's plans follow the measurement.
    sizes = [("wr", s) for s in spec.workspace_limits] + [("wd", s) for s in spec.total_workspaces]
    waiting = [{u.id for _, u in r.kernels} - set(benches) for r in requests]
    needed_by: dict[str, list[int]] = {}
    for i, left in enumerate(waiting):
        for uid in left:
            needed_by.setdefault(uid, []).append(i)
    stored: list[dict[str, Any] | None] = [None] * len(requests)  # per request, once its table is stored
    tasks: list[PlanTask] = []
    # feeds the engine's CPU planning; an engine that schedules tasks itself (Ray) takes several tables at once
    planner = ThreadPoolExecutor(getattr(engine, "plan_concurrency", 1), thread_name_prefix="ucudnn-plan")
    planning: list[Future] = []

    def plan_all(batch: list[PlanTask]) -> list[tuple[PlanTask, list[dict[str, Any]]]]:
        out = []
        for task, answers in engine.plan(batch):
            out.append((task, answers))
            progress.planned(len(task.requests))
        return out

    def ready(i: int) -> None:
        """Request ``i`` has every unit: store its table and start planning it."""
        r = requests[i]
        table = BenchmarkTable(r.target.device, r.target.cudnn_version,
                               [KernelBench(name, u.op, u.problem, benches[u.id].measurements,
                                            benches[u.id].skipped, benches[u.id].benchmark_seconds)
                                for name, u in r.kernels], r.numerics, dict(r.extra))
        tid = store.put_table(table)
        bp = key_policy_of(spec.batch_policy, (k.problem.n for k in table.kernels))   # its plans' name and key
        wanted = [(p, s) for p, s in sizes if store.find_plan(plan_key(tid, p, bp, s)) is None]
        stored[i] = {"status": "stored", "id": tid, "plans_already_stored": len(sizes) - len(wanted)}
        progress.planned(len(sizes) - len(wanted))  # the bar counts every requested plan; these are done
        # small tasks, WR and WD mixed, so CPUs share the work evenly (a WD solve costs ~10 WR plans)
        chunks = max(1, -(-len(wanted) // PLAN_TASK_SIZE))
        mine = [PlanTask(tid, table, wanted[j::chunks], bp) for j in range(chunks) if wanted[j::chunks]]
        if mine:
            tasks.extend(mine)
            planning.append(planner.submit(plan_all, mine))

    def on_outcome(o: UnitOutcome) -> None:
        if o.status == "measured" and o.bench is not None:
            store.put_kernel_bench(o.unit.key(), o.bench)
            benches[o.unit.id] = o.bench
            for i in needed_by.pop(o.unit.id, []):
                waiting[i].discard(o.unit.id)
                if not waiting[i]:
                    ready(i)
        progress.advance(o)

    progress.start(totals)
    progress.planning(len(requests) * len(sizes))
    t_measure = time.perf_counter()
    try:
        for i, left in enumerate(waiting):
            if not left:  # everything already stored: plan it while the GPUs measure the rest
                ready(i)
        outcomes = dispatch(engine, workers, todo, max_retries=spec.max_retries, on_outcome=on_outcome)
        measure_s = time.perf_counter() - t_measure
        planned_early = sum(f.done() for f in planning)
        engine.release()

        t_plan = time.perf_counter()
        plans_stored, plan_failures = [], []
        for fut in planning:
            for task, answers in fut.result():
                for (policy, size), ans in zip(task.requests, answers):
                    entry = {"table_id": task.table_id, "policy": policy,
                             ("total_workspace" if policy == "wd" else "workspace_limit"): size}
                    if "plan" in ans:
                        plan = ans["plan"]
                        pid = store.put_plan(plan_key(task.table_id, policy, task.batch_policy, size), plan,
                                             task.table_id)
                        plans_stored.append({**entry, "id": pid, "total_time_ms": round(plan.total_time_ms, 6)})
                    else:
                        plan_failures.append({**entry, "error": ans["error"], "infeasible": ans.get("infeasible", False),
                                              "min_workspace": ans.get("min_workspace")})
        plan_s = time.perf_counter() - t_plan
    finally:
        planner.shutdown(wait=True, cancel_futures=True)
        progress.stop()

    by_id = {o.unit.id: o for o in outcomes}
    table_reports: list[dict[str, Any]] = []
    for r, done in zip(requests, stored):
        distinct = {u.id for _, u in r.kernels}
        rep: dict[str, Any] = {"name": r.name, **r.target.to_dict(), "numerics": r.numerics,
                               **({"numerics_note": r.numerics_note} if r.numerics_note else {}),
                               "kernels": len(r.kernels), "units": len(distinct),
                               "gpu_seconds": round(sum(by_id[i].seconds for i in distinct if i in by_id), 3),
                               "recorded_benchmark_seconds": round(sum(
                                   benches[i].benchmark_seconds or 0 for i in distinct if i in benches), 3)}
        if done is None:  # a unit failed: no table, nothing partial looks complete
            missing = [name for name, u in r.kernels if u.id not in benches]
            rep.update(status="incomplete", missing_kernels=missing[:10], missing_count=len(missing))
        else:
            rep.update(done)
        table_reports.append(rep)

    measured = [o for o in outcomes if o.status == "measured"]
    failed = [o for o in outcomes if o.status == "failed"]
    per_target = []
    for t in targets:
        mine = [o for o in outcomes if o.unit.target == t]
        per_target.append({**t.to_dict(), "workers": sum(t in w.targets for w in workers),
                           "units": totals.get(t, (0, 0))[0] + totals.get(t, (0, 0))[1],
                           "skipped": totals.get(t, (0, 0))[1],
                           "measured": sum(o.status == "measured" for o in mine),
                           "failed": sum(o.status == "failed" for o in mine),
                           "gpu_seconds": round(sum(o.seconds for o in mine), 3)})
    return {
        "engine": engine.name,
        "source": source.name,
        "store": safe_url(store.url),
        "spec": spec.to_dict(),
        "targets": per_target,
        "workers": [{"name": w.name, "targets": [t.label() for t in w.targets], "units": w.units,
                     "busy_seconds": round(w.busy_seconds, 3), "alive": w.alive} for w in workers],
        "units": {"total": len(units), "kernels_requested": kernels_requested,
                  "duplicates_removed": kernels_requested - len(units),
                  "measured": len(measured), "skipped": len(units) - len(todo), "failed": len(failed),
                  "retried": sum(o.attempts > 1 for o in outcomes)},
        "gpu_seconds": round(sum(o.seconds for o in outcomes), 3),
        "dispatch_overhead_seconds": round(sum(o.dispatch_seconds for o in outcomes), 3),
        "failed_units": [o.report() for o in failed],
        "tables": table_reports,
        "notes": [f"{name}: {note}" for name, note in notes.items()],
        "plans": {"requested": sum(len(t.requests) for t in tasks) + sum(r.get("plans_already_stored", 0)
                                                                           for r in table_reports),
                  "stored": len(plans_stored), "already_stored": sum(r.get("plans_already_stored", 0)
                                                                     for r in table_reports),
                  "failed": plan_failures, "new": plans_stored},
        "seconds": {"startup": round(startup_s, 3), "measure": round(measure_s, 3), "plan": round(plan_s, 3),  # after measuring
                    "tables_planned_while_measuring": planned_early,
                    "total": round(time.perf_counter() - t_start, 3)},
        "ok": not failed and not any(not f["infeasible"] for f in plan_failures),
    }


def safe_url(url: str) -> str:
    """The store URL without a password (summaries end up in logs)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001
        return url


def open_store(store_url: str | None, out: str | None) -> Store:
    """``--store``, else the ``--out`` bundle (a store file), else the user cache."""
    if store_url:
        return Store(store_url)
    if out:
        return Store(out)
    return Store()


def parse_input_shape(text: str, flag: str = "--input-shape") -> tuple[int, int, int]:
    """``3,224,224`` -> (C, H, W): the per-sample shape a ``--torch-model`` is traced at."""
    parts = [p.strip() for p in text.replace("x", ",").split(",")]
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        raise InputError(f"expected C,H,W as three positive integers such as 3,224,224, got {text!r}", flag)
    return dims  # type: ignore[return-value]


#: The batch a ``--torch-model`` is precomputed at when neither ``@B`` nor ``--batch`` names one (the shipped
#: ResNet-50's; a traced model has no batch of its own), said on stderr when used
TORCH_MODEL_BATCH = 128


def parse_torch_model(text: str, flag: str = "--torch-model") -> NetworkRequest:
    """``MODULE:FACTORY[@B,...]`` checked (its form, and that PyTorch is installed), not yet traced."""
    import importlib.util

    req = NetworkRequest.parse(text.strip(), flag)
    module, sep, attr = req.network.partition(":")
    if not sep or not module.strip() or not attr.strip():
        raise InputError(f"expected MODULE:FACTORY[@BATCH,...] such as torchvision.models:resnet50@128, "
                         f"got {text!r}", flag)
    if importlib.util.find_spec("torch") is None:
        raise InputError(f"tracing {req.network} needs PyTorch, which is not installed: pip install ucudnn[torch]",
                         flag)
    return req


def torch_model(text: str, input_shape: Sequence[int], flag: str = "--torch-model") -> NetworkRequest:
    """``MODULE:FACTORY[@B,...]`` traced into a network (:func:`ucudnn.planning.network.from_factory`): the
    factory is imported and called with no arguments, its Conv2d layers recorded on CPU at ``input_shape``.

    The request is then a network like any ``--network``: the job crosses it with batch sizes, dtypes,
    layouts and numerics, and its convolutions are units shared with every other request.  Errors name
    ``flag`` (or ``--input-shape``); torch is imported only here, never when the module is.
    """
    req = parse_torch_model(text, flag)
    from ..planning.network import from_factory

    try:
        net = from_factory(req.network, tuple(input_shape), batch=TORCH_MODEL_BATCH, name=req.network)
    except InputError as e:  # from_factory names its own parameters; the user wrote flags
        message = str(e).removeprefix(f"{e.field}: ") if e.field else str(e)
        raise InputError(message, "--input-shape" if e.field == "input_shape" else flag) from None
    except Exception as e:  # noqa: BLE001 - the factory or the model's forward pass: both are the user's code
        shape = ",".join(str(d) for d in input_shape)
        raise InputError(f"tracing {req.network} at --input-shape {shape} failed: {type(e).__name__}: {e}",
                         flag) from None
    return NetworkRequest(req.network, req.batch_sizes, built=net,
                          input_shape=tuple(int(d) for d in input_shape))  # type: ignore[arg-type]


def merge_flags(spec: JobSpec | None, args: Any) -> JobSpec:
    """Job-file fields overridden by the flags given on the command line."""
    spec = spec or JobSpec()
    if args.network:
        spec.networks = [NetworkRequest.parse(n.strip(), "--network") for n in args.network]
    torch_models = getattr(args, "torch_models", None) or []
    input_shape = getattr(args, "input_shape", None)
    if input_shape is not None and not torch_models:
        raise InputError("is the shape --torch-model models are traced at; give --torch-model MODULE:FACTORY too",
                         "--input-shape")
    if torch_models:
        if input_shape is None:
            raise InputError("needs --input-shape C,H,W (e.g. 3,224,224): the shape of one sample to trace the "
                             "model at", "--input-shape")
        shape = parse_input_shape(input_shape)
        for t in torch_models:  # checked before tracing anything
            req = parse_torch_model(t)
            if not (req.batch_sizes or args.batch or spec.batch_sizes):
                print(f"ucudnn precompute: {req.network}: no batch size given ({req.network}@B or --batch B); "
                      f"precomputing batch {TORCH_MODEL_BATCH}", file=sys.stderr)
        spec.networks = spec.networks + [torch_model(t, shape) for t in torch_models]
    if args.tables:
        spec.tables = list(args.tables)
    if args.batch:
        try:
            spec.batch_sizes = [int(b) for b in _split(args.batch)]
        except ValueError:
            raise InputError(f"expected comma-separated integers, got {args.batch!r}", "--batch") from None
    for flag, key in (("dtype", "dtypes"), ("layout", "layouts"), ("ops", "ops"), ("gpu_models", "gpu_models")):
        v = getattr(args, flag)
        if v:
            setattr(spec, key, _split(v))
    if args.numerics:
        spec.numerics = _split(args.numerics)
    if args.batch_policy:
        spec.batch_policy = normalize_policy(args.batch_policy, "--batch-policy")
    if args.workspace_limits:
        spec.workspace_limits = [parse_size(v, "--workspace-limits", allow_zero=False) for v in _split(args.workspace_limits)]
    if args.total_workspaces:
        spec.total_workspaces = [parse_size(v, "--total-workspaces", allow_zero=False) for v in _split(args.total_workspaces)]
    if args.repeat is not None:
        spec.repeat = args.repeat
    if args.max_retries is not None:
        spec.max_retries = args.max_retries
    if getattr(args, "sources", None) is not None:
        spec.sources = list(source_names.canonical(args.sources, "--sources"))
    if getattr(args, "channel_policy", None) is not None:
        spec.channel_policy = normalize_channel_policy(args.channel_policy, "--channel-policy")
    if not spec.workspace_limits and not spec.total_workspaces:
        from ..config import default_workspace_limit, total_workspace_size

        spec.workspace_limits = [default_workspace_limit()]
        if total_workspace_size():
            spec.total_workspaces = [total_workspace_size()]  # type: ignore[list-item]
    spec.check("--network" if args.network or not spec.tables else "--from-table")
    return spec


def job_rows(spec: JobSpec, summary: dict[str, Any], store: Store) -> tuple[list[str], list[str], list[str]]:
    """(table ids, kernel-bench ids, plan ids) of a finished job's stored tables: what its bundle carries."""
    from ..catalog.store import key_id

    table_ids = [t["id"] for t in summary["tables"] if t.get("status") == "stored"]
    bench_ids: set[str] = set()
    for tid in table_ids:
        table = store.get_table(tid)
        if table is None:
            continue
        target = Target(table.device, table.cudnn_version)
        numerics = effective_numerics(table).numerics
        srcs = source_names.of_table(table.extra)
        cp = channel_policy_of(table.extra)
        bench_ids |= {key_id(Unit(target, k.problem, k.op, numerics, spec.batch_policy, srcs, cp).key())
                      for k in table.kernels}
    wanted = set(table_ids)
    plan_ids = [p["id"] for p in store.list_plans() if p["table_id"] in wanted]
    return table_ids, sorted(bench_ids), plan_ids


def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def print_summary(summary: dict[str, Any], file: Any = None) -> None:
    json.dump(summary, file or sys.stdout, indent=1, allow_nan=False)
    (file or sys.stdout).write("\n")
