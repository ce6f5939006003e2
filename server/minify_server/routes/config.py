"""/v1/config: the torch settings a job's spec may set, as the live workers' torch takes them."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from minify_contract import queue
from minify_contract.config_schema import ConfigSchemas
from minify_server.auth import require_token

router = APIRouter(prefix="/v1/config", tags=["config"], dependencies=[Depends(require_token)])


@router.get("", response_model=ConfigSchemas,
            summary="The settings JobSpec.config may name, and the values each takes, per live torch")
async def config_schemas(request: Request) -> ConfigSchemas:
    return ConfigSchemas(schemas=await queue.config_schemas(request.app.state.redis))
