"""Operations endpoints: liveness and Prometheus metrics."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from ucudnn import __version__

from ..deps import ServiceState, get_state
from ..models import Health

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health)
async def healthz(state: ServiceState = Depends(get_state)) -> Health:
    """Liveness plus what this server is: version, store dialect, whether benchmark jobs can run."""
    return Health(status="ok", version=__version__, store=state.store.engine.dialect.name, gpu=state.jobs.gpu_checked)


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
def metrics(state: ServiceState = Depends(get_state)) -> Response:
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)
