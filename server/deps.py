"""What every route depends on: the service's state and the bearer-token check.

Security model: reads (GET) are open; writes need ``Authorization: Bearer
<token>`` when the server has a token (``UCUDNN_API_TOKEN``).  Writes are
``POST /v1/tables``, ``POST /v1/jobs`` and, by default, ``POST /v1/plans``:
planning costs CPU (WD solves can take seconds) and stores the derived plan,
and an inline table is stored like ``POST /v1/tables``.  ``open_plans=True``
(``ucudnn serve --open-plans``) lets anyone plan *stored* tables by id;
plans with an inline table still need the token.  Tokens are compared with
:func:`hmac.compare_digest` (constant time).
"""
from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ucudnn.catalog.store import Store

from .metrics import Metrics

if TYPE_CHECKING:
    from .jobs import JobRunner
    from .planning import PlanService


# Dependencies are ``async def`` although they await nothing: FastAPI runs plain ``def`` dependencies in
# its thread pool, and two thread hops per request were the largest cost of a cached plan (profiled).


@dataclass
class ServiceState:
    store: Store
    plans: "PlanService"
    jobs: "JobRunner"
    metrics: Metrics
    api_token: str | None
    open_plans: bool


async def get_state(request: Request) -> ServiceState:
    return request.app.state.ucudnn


bearer = HTTPBearer(auto_error=False, scheme_name="bearer",
                    description="UCUDNN_API_TOKEN of the server; needed for writes when the server has one")


def token_ok(state: ServiceState, credentials: HTTPAuthorizationCredentials | None) -> bool:
    if state.api_token is None:
        return True
    if credentials is None or credentials.scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(credentials.credentials.encode(), state.api_token.encode())


def unauthorized() -> HTTPException:
    return HTTPException(401, "this server needs 'Authorization: Bearer <token>' (its UCUDNN_API_TOKEN) for writes",
                         headers={"WWW-Authenticate": "Bearer"})


async def require_token(state: ServiceState = Depends(get_state),
                  credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
    if not token_ok(state, credentials):
        raise unauthorized()


async def plan_credentials(state: ServiceState = Depends(get_state),
                     credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> bool:
    """Whether the caller may write; refuses at once unless plans are open (then the body decides)."""
    ok = token_ok(state, credentials)
    if not ok and not state.open_plans:
        raise unauthorized()
    return ok
