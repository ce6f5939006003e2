"""The FastAPI application: routes, error handlers, static dashboard, Redis connections."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minify_server import connections, retention
from minify_server.bugs import BugIndex, retest_periodically
from minify_server.config import Settings
from minify_server.errors import install_error_handlers
from minify_server.events import BLOCK_MS
from minify_server.records import JobRecords
from minify_server.routes import bisect, bugs, config, docs, jobs, system, workers
from minify_server.store import ArtifactStore

log = logging.getLogger(__name__)

BACKGROUND_STOP_S = 5.0
# Routes that answer only after talking to Redis: a success there means Redis is back.
_REDIS_ROUTES = ("/v1", "/healthz", "/metrics")


class _RedisRecovery:
    """Ends a logged Redis outage at the first successful answer of a route that uses Redis."""

    def __init__(self, app: ASGIApp, outages: connections.OutageLog) -> None:
        self.app = app
        self.outages = outages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.outages.since is None or not scope["path"].startswith(_REDIS_ROUTES):
            await self.app(scope, receive, send)
            return

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and 200 <= message["status"] < 300:
                self.outages.recovered()
            await send(message)

        await self.app(scope, receive, watch)


def create_app(settings: Settings, redis_url: str) -> FastAPI:
    """The app for `settings`, talking to the Redis at `redis_url` (shared, or the embedded one)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.redis = connections.async_client(redis_url)
        app.state.stream_redis = connections.async_client(
            redis_url, read_timeout_s=BLOCK_MS / 1000 + connections.READ_TIMEOUT_S)
        app.state.sync_redis = connections.sync_client(redis_url)
        app.state.records = JobRecords(app.state.redis)
        app.state.bugs = BugIndex(app.state.redis)
        sweeper = asyncio.create_task(retention.sweep_periodically(
            app.state.redis, app.state.store, settings.retention_days, settings.retention_sweep_interval_s),
            name="retention sweep")
        retester = asyncio.create_task(retest_periodically(
            app.state.bugs, app.state.sync_redis, app.state.store, settings.retest_per_sweep,
            settings.retest_interval_s), name="bug re-tests")
        try:
            yield
        finally:
            for task in (sweeper, retester):
                task.cancel()
            # Bounded: a task that swallowed its cancel must not hold the server (and its children) for good.
            _, stuck = await asyncio.wait((sweeper, retester), timeout=BACKGROUND_STOP_S)
            for task in stuck:
                log.warning("background task %s did not stop in %.0f s; leaving it", task.get_name(),
                            BACKGROUND_STOP_S)
            await app.state.redis.aclose()
            await app.state.stream_redis.aclose()
            app.state.sync_redis.close()

    # /docs and /redoc come from routes.docs: FastAPI's own pages load their scripts from a CDN.
    app = FastAPI(title="minify", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Turn a failing PyTorch program into the smallest program that fails the same way.")
    app.state.settings = settings
    app.state.store = ArtifactStore(settings.data_dir)
    app.state.redis_outages = connections.OutageLog()
    app.state.stopping = asyncio.Event()  # set when the server begins to stop (cli.StoppingServer): streams end
    install_error_handlers(app)
    app.add_middleware(_RedisRecovery, outages=app.state.redis_outages)
    app.include_router(jobs.router)
    app.include_router(bisect.router)
    app.include_router(bugs.router)
    app.include_router(workers.router)
    app.include_router(config.router)
    app.include_router(system.router)
    app.include_router(docs.router)
    app.mount("/static", StaticFiles(directory=system.STATIC_DIR, check_dir=False), name="static")
    return app
