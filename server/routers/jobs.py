"""``/v1/jobs``: benchmark problems on the server's GPU; poll for progress; the result is a stored table."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path
from fastapi.concurrency import run_in_threadpool

from ..deps import ServiceState, get_state, require_token
from ..limits import FiniteJSONRoute
from ..models import ID_PATTERN, JobRequest, JobStatus
from ._common import errors

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=FiniteJSONRoute)


@router.post("", status_code=202, response_model=JobStatus, dependencies=[Depends(require_token)],
             responses=errors(401, 413, 422, 503))
async def submit_job(req: JobRequest, state: ServiceState = Depends(get_state)) -> dict[str, Any]:
    """Queue a benchmark of ``problems`` x ``ops``; 503 on a host without a usable GPU."""
    job_id = await run_in_threadpool(state.jobs.submit, req)
    return await run_in_threadpool(state.jobs.status, job_id)


@router.get("/{job_id}", response_model=JobStatus, responses=errors(404, 422))
def job_status(job_id: str = Path(pattern=ID_PATTERN), state: ServiceState = Depends(get_state)) -> dict[str, Any]:
    """Status and progress; once ``done``, ``table_id`` names the measured table."""
    return state.jobs.status(job_id)
