"""Answering plan requests: normalise, look up (memory, then store), else solve once.

A request is normalised to a key (table id, policy, sizes in bytes, batch
policy) so ``"64MiB"`` and ``67108864`` are the same plan; the key's hash is
the plan id (``ucudnn.catalog.store.key_id``).  Lookups go memory (an LRU of ready
response bytes: a cached plan costs no JSON work) -> store -> planner.
Concurrent identical requests share one solve (single-flight: one asyncio
task per plan id, awaited by every request that wants it), so a burst of
identical cold requests computes once.  The store makes concurrent solves in
*different* server processes harmless (one row per id), just not free.

Planners run in a small thread pool: WR is milliseconds, WD (an ILP) can be
seconds, and neither may block the event loop that answers cached plans.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ucudnn.catalog.store import Store, key_id
from ucudnn.errors import InfeasibleError, InputError, UcudnnError
from ucudnn.planning.planner import plan as make_plan
from ucudnn.planning.plan import Plan
from ucudnn.planning.table import BenchmarkTable
from ucudnn.policy import key_policy_of, normalize_policy
from ucudnn.units import parse_size

from .metrics import Metrics
from .models import PlanRequest

log = logging.getLogger("ucudnn.server")
#: bump when the meaning of a key changes: old plans are then simply not found (and planned again from their table).
#: 2: WR's choices of ucudnn.planning.wr.RULES 2 (legacy calls weighed by their in-step host work)
KEY_VERSION = 2
RAW_BODY_MAX = 2048  # request bodies remembered verbatim (table_id requests; inline tables are larger)
TABLES_IN_MEMORY = 32  # parsed tables: loading one from the store re-validates it (~0.3 s for ResNet-50)


class UnknownId(InputError):
    """An id that names nothing in the store (404)."""


class PlanService:
    def __init__(self, store: Store, metrics: Metrics, cache_size: int = 4096, solver_threads: int = 2):
        self.store = store
        self.metrics = metrics
        self.cache_size = cache_size
        self._cache: OrderedDict[str, bytes] = OrderedDict()  # plan id -> response body
        self._inflight: dict[str, asyncio.Future[bytes]] = {}
        self._raw: OrderedDict[bytes, str] = OrderedDict()  # exact request body -> plan id
        self._tables: OrderedDict[str, BenchmarkTable] = OrderedDict()  # content id -> table (immutable by id)
        self._tables_lock = threading.Lock()
        self.pool = ThreadPoolExecutor(solver_threads, thread_name_prefix="ucudnn-plan")

    # -- the request ----------------------------------------------------------------
    @staticmethod
    def key(req: PlanRequest, table_id: str) -> dict[str, Any]:
        """The normalised request; raises InputError naming the field for sizes and policies."""
        if req.policy == "wd":
            if req.workspace_limit is not None:
                raise InputError("is a per-kernel limit for the wr/undivided policies; wd uses total_workspace",
                                 "workspace_limit")
            if req.total_workspace is None:
                raise InputError("the wd policy needs a whole-table budget such as '120MiB'", "total_workspace")
            sizes = {"workspace_limit": None,
                     "total_workspace": parse_size(req.total_workspace, "total_workspace", allow_zero=False)}
        else:
            if req.total_workspace is not None:
                raise InputError(f"is the wd policy's budget; {req.policy} uses workspace_limit", "total_workspace")
            if req.workspace_limit is None:
                raise InputError(f"the {req.policy} policy needs a per-kernel limit such as '64MiB'", "workspace_limit")
            sizes = {"workspace_limit": parse_size(req.workspace_limit, "workspace_limit", allow_zero=False),
                     "total_workspace": None}
        batch_policy = normalize_policy(req.batch_policy)
        if req.policy == "undivided":
            batch_policy = "undivided"  # the undivided policy plans the full mini-batch whatever is asked
        if req.unwritten and req.policy != "wr":
            raise InputError(f"unwritten memory is planned by the wr policy only, not {req.policy!r}", "unwritten")
        extra = {"unwritten": True} if req.unwritten else {}   # left out when false: earlier keys still answer
        if not req.host_ties:
            if req.policy == "wd":
                raise InputError("host near-ties are a wr / undivided rule; wd plans the fastest", "host_ties")
            extra["host_ties"] = False                          # likewise, left out when true
        return {"service": KEY_VERSION, "table_id": table_id, "policy": req.policy, "batch_policy": batch_policy,
                **sizes, **extra}

    def cached_for_body(self, raw: bytes) -> bytes | None:
        """The answer to a request with exactly these body bytes, if it was answered before and is in memory.

        Safe because a body's meaning never changes (the key is a pure function of it); only
        ``table_id`` requests are remembered, so this never skips an inline table's write check.
        """
        pid = self._raw.get(raw)
        if pid is None:
            return None
        body = self._cache_get(pid)
        if body is not None:
            self.metrics.plan_hits.labels("memory").inc()
        return body

    async def plan(self, req: PlanRequest, raw: bytes | None = None) -> bytes:
        """The response body for ``req``: from memory, the store, a running identical solve, or a new solve."""
        if (req.table is None) == (req.table_id is None):
            raise InputError("give exactly one of table_id (a stored table) and table (an inline table)", "table_id")
        loop = asyncio.get_running_loop()
        table: BenchmarkTable | None = None
        if req.table is not None:
            table = await loop.run_in_executor(self.pool, BenchmarkTable.from_dict, req.table)
            table = table.resolved()  # stored and planned with the numerics it is taken to have
            table_id = table.content_id()
        else:
            assert req.table_id is not None
            table_id = req.table_id
        key = self.key(req, table_id)
        pid = key_id(key)
        if raw is not None and req.table is None and len(raw) <= RAW_BODY_MAX:
            self._raw[raw] = pid
            while len(self._raw) > self.cache_size:
                self._raw.popitem(last=False)
        body = self._cache_get(pid)
        if body is not None:
            self.metrics.plan_hits.labels("memory").inc()
            return body
        task = self._inflight.get(pid)
        if task is not None:
            self.metrics.plan_hits.labels("inflight").inc()
        else:
            task = asyncio.ensure_future(loop.run_in_executor(self.pool, self._lookup_or_solve, pid, key, table))
            self._inflight[pid] = task
            task.add_done_callback(lambda t, pid=pid: self._finished(pid, t))
        # shield: a client that hangs up must not cancel the solve others are waiting for
        return await asyncio.shield(task)

    async def get(self, plan_id: str) -> bytes:
        body = self._cache_get(plan_id)
        if body is not None:
            self.metrics.plan_hits.labels("memory").inc()
            return body
        record = await asyncio.get_running_loop().run_in_executor(self.pool, self.store.get_plan_record, plan_id)
        if record is None:
            raise UnknownId(f"no plan with id {plan_id!r}", "plan_id")
        self.metrics.plan_hits.labels("store").inc()
        return self._remember(plan_id, _response(plan_id, record[1], record[0]))

    # -- the work -------------------------------------------------------------------
    def _lookup_or_solve(self, pid: str, key: dict[str, Any], table: BenchmarkTable | None) -> bytes:
        table_id = key["table_id"]
        record = self.store.get_plan_record(pid)
        if record is not None:
            self.metrics.plan_hits.labels("store").inc()
            return _response(pid, record[1] or table_id, record[0])
        if table is None:
            table = self._tables.get(table_id) or self.store.get_table(table_id)
            if table is None:
                raise UnknownId(f"no table with id {table_id!r}; store it with POST /v1/tables first", "table_id")
            table = table.resolved()  # a table stored without numerics (older stores): the plan records them
        else:
            self.store.put_table(table)  # an inline table is stored as POST /v1/tables would
        self.remember_table(table_id, table)
        # the batch policy that measures the same sizes at this table's mini-batch (even splits at a power of two
        # are powerOfTwo's sizes): its plan is this one, so it is found, or planned and kept, under both keys
        same = {**key, "batch_policy": key_policy_of(key["batch_policy"], (k.problem.n for k in table.kernels))}
        if same != key:
            record = self.store.get_plan_record(key_id(same))
            if record is not None:
                self.metrics.plan_hits.labels("store").inc()
                self.store.put_plan(key, Plan.from_dict(json.loads(record[0])), table_id)
                return _response(pid, table_id, record[0])
        self.metrics.plan_misses.labels(key["policy"]).inc()
        start = time.perf_counter()
        try:
            plan = make_plan(table, key["policy"], workspace_limit=key["workspace_limit"],
                             total_workspace=key["total_workspace"], batch_policy=same["batch_policy"],
                             unwritten=bool(key.get("unwritten")), host_ties=key.get("host_ties", True) is not False)
            text = plan.to_json()
        except InfeasibleError as e:
            e.field = "total_workspace" if key["policy"] == "wd" else "workspace_limit"  # type: ignore[attr-defined]
            raise
        except UcudnnError:
            raise
        except ImportError as e:  # a planner that is not installed in this build (e.g. wd's PuLP)
            raise InputError(f"the {key['policy']} planner is not available on this server ({e})", "policy") from None
        except Exception as e:  # noqa: BLE001 - a planner bug must not become a 500 without a message
            log.exception("planner %s failed on table %s", key["policy"], table_id)
            raise InputError(f"the {key['policy']} planner failed on this table: {type(e).__name__}: {e}",
                             "policy") from None
        finally:
            self.metrics.solve_seconds.labels(key["policy"]).observe(time.perf_counter() - start)
        self.store.put_plan(key, plan, table_id)
        if same != key:
            self.store.put_plan(same, plan, table_id)
        return _response(pid, table_id, text)

    def remember_table(self, table_id: str, table: BenchmarkTable) -> None:
        """Keep a parsed table for the next cold plan of it (called from solver threads and request threads)."""
        with self._tables_lock:
            self._tables[table_id] = table
            self._tables.move_to_end(table_id)
            while len(self._tables) > TABLES_IN_MEMORY:
                self._tables.popitem(last=False)

    def _finished(self, pid: str, task: asyncio.Future[bytes]) -> None:
        self._inflight.pop(pid, None)
        if not task.cancelled() and task.exception() is None:
            self._remember(pid, task.result())

    def _cache_get(self, pid: str) -> bytes | None:
        body = self._cache.get(pid)
        if body is not None:
            self._cache.move_to_end(pid)
        return body

    def _remember(self, pid: str, body: bytes) -> bytes:
        self._cache[pid] = body
        self._cache.move_to_end(pid)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return body


def _response(pid: str, table_id: str | None, plan_text: str) -> bytes:
    doc = json.loads(plan_text)
    return json.dumps({"id": pid, "table_id": table_id, **doc}, allow_nan=False).encode()
