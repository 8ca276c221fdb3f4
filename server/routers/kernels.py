"""``/v1/kernel-benches``: the library's kernel measurements, shared between nodes.

``ucudnn.api`` keys each kernel's measurements by (device, cuDNN version,
problem, op, numerics, batch policy, and the algorithm sources unless legacy alone); with ``UCUDNN_PLAN_SERVER`` set it asks
here (by the key's hash, ``ucudnn.catalog.store.key_id``) before benchmarking, and
uploads what it measured.  Same rows as the library's own store.
"""
from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from ucudnn.catalog.store import MAX_INT32, key_id
from ucudnn.errors import InputError
from ucudnn.planning.table import FORMAT, BenchmarkTable

from ..deps import ServiceState, get_state, require_token
from ..limits import FiniteJSONRoute
from ..models import ID_PATTERN, TableCreated
from ..planning import UnknownId
from ._common import errors

router = APIRouter(prefix="/v1/kernel-benches", tags=["kernel benches"], route_class=FiniteJSONRoute)


class KernelBenchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: dict[str, Any] = Field(description="the library's cache key: device, cudnn_version, problem, op, "
                                            "numerics, batch_policy, and sources (absent for legacy alone)")
    bench: dict[str, Any] = Field(description="one kernel of a ucudnn-benchmark-table/1 (name, op, problem, "
                                              "measurements)")


@router.post("", status_code=201, response_model=TableCreated, dependencies=[Depends(require_token)],
             responses=errors(401, 413, 422))
def put_kernel_bench(body: KernelBenchIn, state: ServiceState = Depends(get_state)) -> TableCreated:
    """Share one kernel's measurements under the library's cache key; the id is the key's hash."""
    device, version = body.key.get("device"), body.key.get("cudnn_version")
    if not isinstance(device, str) or not 0 < len(device) <= 256:
        raise InputError("must be the device name (a non-empty string)", "key.device")
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= MAX_INT32:
        raise InputError("must be the cuDNN version (an integer such as 91900)", "key.cudnn_version")
    # validate the kernel exactly as a table's kernel would be (one format, one validator)
    try:
        table = BenchmarkTable.from_dict({"format": FORMAT, "device": device, "cudnn_version": version,
                                          "kernels": [body.bench]})
    except InputError as e:
        raise InputError(str(e).split(": ", 1)[-1], "bench" + (e.field or "").removeprefix("kernels[0]")) from None
    state.store.put_kernel_bench(body.key, table.kernels[0])
    return TableCreated(id=key_id(body.key))


@router.get("/{bench_id}", responses={200: {"description": "one kernel of a ucudnn-benchmark-table/1"},
                                      **errors(404, 422)})
def get_kernel_bench(bench_id: str = Path(pattern=ID_PATTERN), state: ServiceState = Depends(get_state)) -> Response:
    kb = state.store.get_kernel_bench_by_id(bench_id)
    if kb is None:
        raise UnknownId(f"no kernel measurements under id {bench_id!r}", "bench_id")
    return Response(json.dumps(kb.to_dict(), allow_nan=False), media_type="application/json")
