"""``/v1/tables``: store benchmark tables (idempotent on content) and find them by device and cuDNN version."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Path, Query, Response

from ucudnn.catalog.store import MAX_INT32
from ucudnn.planning.table import BenchmarkTable, effective_numerics

from ..deps import ServiceState, get_state, require_token
from ..limits import FiniteJSONRoute
from ..models import ID_PATTERN, TableCreated, TableSummary
from ..planning import UnknownId
from ._common import errors

router = APIRouter(prefix="/v1/tables", tags=["tables"], route_class=FiniteJSONRoute)


@router.post("", status_code=201, response_model=TableCreated, dependencies=[Depends(require_token)],
             responses=errors(401, 413, 422))
def put_table(document: dict[str, Any] = Body(description="a ucudnn-benchmark-table/1 document"),
              state: ServiceState = Depends(get_state)) -> TableCreated:
    """Store a benchmark table. Its id is a hash of its content: storing it again answers the same id.

    A table without a ``numerics`` field is stored with the numerics it is taken to have (its dtype's
    default, or the narrowest numerics its math types allow); the answer says which, and how.
    """
    table = BenchmarkTable.from_dict(document)
    numerics, note = effective_numerics(table)
    table = table.resolved()  # the same content id: ids hash the numerics a table is taken to have
    table_id = state.store.put_table(table)
    state.plans.remember_table(table_id, table)  # its first plan need not parse it again
    return TableCreated(id=table_id, numerics=numerics, numerics_note=note)


@router.get("", response_model=list[TableSummary], responses=errors(422))
def list_tables(device: str | None = Query(None, max_length=256, description="exact device name, e.g. 'NVIDIA H100 80GB HBM3'"),
                cudnn_version: int | None = Query(None, ge=0, le=MAX_INT32, description="e.g. 91900"),
                state: ServiceState = Depends(get_state)) -> list[dict[str, Any]]:
    """Summaries of the stored tables, oldest first, optionally of one device and cuDNN version."""
    return state.store.list_tables(device=device, cudnn_version=cudnn_version)


@router.get("/{table_id}", responses={200: {"description": "the ucudnn-benchmark-table/1 document"}, **errors(404, 422)})
def get_table(table_id: str = Path(pattern=ID_PATTERN), state: ServiceState = Depends(get_state)) -> Response:
    table = state.store.get_table(table_id)
    if table is None:
        raise UnknownId(f"no table with id {table_id!r}", "table_id")
    return Response(table.to_json(), media_type="application/json")
