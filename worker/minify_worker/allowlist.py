"""What the worker's operator allows, as environment variables of comma-separated prefixes: custom
backends' modules (`MINIFY_ALLOWED_BACKENDS`), custom ops' modules (`MINIFY_ALLOWED_OP_MODULES`).

Torch-free: op_modules reads it in a spawned fork server before torch is imported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def allowed_prefixes(variable: str, environment: Mapping[str, str] = os.environ) -> list[str]:
    """The comma-separated prefixes `environment[variable]` lists, spaces around each and empty
    ones dropped ([] when it is unset)."""
    return [prefix.strip() for prefix in environment.get(variable, "").split(",") if prefix.strip()]
