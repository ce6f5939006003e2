"""The routes outside /v1: dashboard, health and metrics (open, no token)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from redis.exceptions import RedisError
from starlette.concurrency import run_in_threadpool

from minify_client.models import Health
from minify_server import metrics, queue

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

router = APIRouter(tags=["service"])


@router.get("/", include_in_schema=False, response_model=None)
async def dashboard() -> FileResponse | HTMLResponse:
    index = STATIC_DIR / "index.html"
    if index.is_file():
        return FileResponse(index, media_type="text/html")
    return HTMLResponse("<!doctype html><title>minify</title><p>minify: the dashboard is not installed; "
                        "the API is at <a href='/docs'>/docs</a>.</p>")


@router.get("/healthz", response_model=Health, summary="Redis reachable, workers seen")
async def healthz(request: Request) -> Response:
    try:
        await request.app.state.redis.ping()
        sync_redis = request.app.state.sync_redis
        workers = await run_in_threadpool(queue.worker_count, sync_redis)
        depths = await run_in_threadpool(queue.queue_depths, sync_redis)
    except (RedisError, OSError):
        health = Health(status="degraded", redis=False, workers=0)
        return JSONResponse(health.model_dump(), status_code=503)
    health = Health(status="ok" if workers else "degraded", redis=True, workers=workers, queues=depths)
    return JSONResponse(health.model_dump())


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def prometheus_metrics(request: Request) -> Response:
    records = request.app.state.records
    sync_redis = request.app.state.sync_redis
    body = metrics.render(
        await records.statuses(),
        await run_in_threadpool(queue.queue_depths, sync_redis),
        await run_in_threadpool(queue.worker_count, sync_redis),
        await records.counters(),
    )
    return Response(body, media_type="text/plain; version=0.0.4")
