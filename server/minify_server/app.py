"""The FastAPI application: routes, error handlers, static dashboard, Redis connections."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
import redis.asyncio
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from minify_server.config import Settings
from minify_server.errors import install_error_handlers
from minify_server.records import JobRecords
from minify_server.routes import jobs, system
from minify_server.store import ArtifactStore


def create_app(settings: Settings, redis_url: str) -> FastAPI:
    """The app for `settings`, talking to the Redis at `redis_url` (shared, or the embedded one)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.redis = redis.asyncio.Redis.from_url(redis_url, decode_responses=True, socket_timeout=30)
        app.state.sync_redis = redis.Redis.from_url(redis_url)
        app.state.records = JobRecords(app.state.redis)
        try:
            yield
        finally:
            await app.state.redis.aclose()
            app.state.sync_redis.close()

    app = FastAPI(title="minify", version="1", lifespan=lifespan,
                  description="Turn a failing PyTorch program into the smallest program that fails the same way.")
    app.state.settings = settings
    app.state.store = ArtifactStore(settings.data_dir)
    install_error_handlers(app)
    app.include_router(jobs.router)
    app.include_router(system.router)
    app.mount("/static", StaticFiles(directory=system.STATIC_DIR, check_dir=False), name="static")
    return app
