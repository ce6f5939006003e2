"""The routes outside /v1: dashboard, health and metrics (open, no token)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from minify_contract import queue
from minify_contract.models import Health
from minify_server import metrics
from minify_server.connections import RETRY_AFTER_S, UNAVAILABLE

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

HEALTH_TIMEOUT_S = 2.0

router = APIRouter(tags=["service"])


@router.get("/", include_in_schema=False, response_model=None)
async def dashboard() -> FileResponse | HTMLResponse:
    index = STATIC_DIR / "index.html"
    if index.is_file():
        return FileResponse(index, media_type="text/html")
    return HTMLResponse("<!doctype html><title>minify</title><p>minify: the dashboard is not installed; "
                        "the API is at <a href='/docs'>/docs</a>.</p>")


@router.get("/healthz", response_model=Health, summary="Redis reachable, live workers")
async def healthz(request: Request) -> Response:
    redis = request.app.state.redis
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT_S):  # a hung Redis must not hang the health check
            await redis.ping()
            workers = await queue.live_workers(redis)
            depths = await queue.queue_depths(redis)
    except (*UNAVAILABLE, TimeoutError) as error:
        request.app.state.redis_outages.failed(error)
        health = Health(status="degraded", redis=False, workers=0)
        return JSONResponse(health.model_dump(), status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_S)})
    health = Health(status="ok" if workers else "degraded", redis=True, workers=workers, queues=depths)
    return JSONResponse(health.model_dump())


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def prometheus_metrics(request: Request) -> Response:
    records = request.app.state.records
    redis = request.app.state.redis
    body = metrics.render(
        await records.statuses(),
        await queue.queue_depths(redis),
        await queue.live_workers(redis),
        await records.counters(),
        await request.app.state.bugs.count(),
        await run_in_threadpool(request.app.state.store.size_bytes),
        queue.torch_versions_held(await queue.worker_infos(redis)),
    )
    return Response(body, media_type="text/plain; version=0.0.4")
