"""``/v1/plans``: plan a table under a policy; identical requests are answered from memory or the store."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Request, Response

from ..deps import ServiceState, get_state, plan_credentials, unauthorized
from ..limits import FiniteJSONRoute, parse_body
from ..models import ID_PATTERN, PlanRequest, PlanResponse
from ._common import errors

router = APIRouter(prefix="/v1/plans", tags=["plans"], route_class=FiniteJSONRoute)


@router.post("", response_model=PlanResponse, responses=errors(401, 404, 409, 413, 422),
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": PlanRequest.model_json_schema()}}}})
async def create_plan(request: Request, may_write: bool = Depends(plan_credentials),
                      state: ServiceState = Depends(get_state)) -> Response:
    """Plan a stored (``table_id``) or inline (``table``) benchmark table.

    ``wr``/``undivided`` take ``workspace_limit`` (per kernel); ``wd`` takes ``total_workspace``
    (whole table).  Sizes are bytes or strings like ``"64MiB"``.  The answer is a
    ``ucudnn-plan/1`` document with top-level ``total_time_ms``, plus its ``id``.
    When no configuration fits, 409 names the smallest budget that does.
    """
    # The body is read here rather than declared as a parameter so that a request whose exact bytes
    # were answered before skips JSON parsing and validation: the hot path of a plan service.
    raw = await request.body()
    hit = state.plans.cached_for_body(raw)
    if hit is not None:
        return Response(hit, media_type="application/json")
    req = parse_body(raw, PlanRequest)
    if req.table is not None and not may_write:
        raise unauthorized()  # an inline table is stored: a write even when plans are open
    return Response(await state.plans.plan(req, raw), media_type="application/json")


@router.get("/{plan_id}", response_model=PlanResponse, responses=errors(404, 422))
async def get_plan(plan_id: str = Path(pattern=ID_PATTERN), state: ServiceState = Depends(get_state)) -> Response:
    return Response(await state.plans.get(plan_id), media_type="application/json")
