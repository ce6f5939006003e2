"""Turn a failing compile into a minify job, or into files to submit later: the graph that failed.

    from minify_client.capture import capture_failures

    with capture_failures(model, (x,), spec={"config": {...}}, submit_to="http://minify:8000"):
        torch.compile(model)(x)            # or torch._inductor.aoti_compile_and_package(ep)

When a compiler call fails in the block, the graph that compiler received is captured: with
graph breaks, only the graph that failed, exported with the inputs it was called with
(`failed_graph`); when none did, the whole model with the block's real inputs (`whole_model`).
It is submitted or written as `<dir>/<name>.pt2` (`<dir>/<name>.json` where torch.export.save cannot
write it: program_file.py), `<dir>/spec.json` and `<dir>/inputs.pt`, and the
original error is re-raised with a note that says where the capture went (`destinations`).

No code change: the pytest plugin (`MINIFY_CAPTURE_DIR=DIR pytest`, or `-p minify_client.pytest_plugin`)
and `python -m minify_client.capture script.py args...` capture every failing compile of the run,
once per bug, into DIR with a manifest `captures.json` (`session`). Opt-in there: a compiled graph
whose first run kills the process still leaves its capture (`crash`, MINIFY_CAPTURE_CRASH=1), and a
failure no captured graph holds is rerun to say which layer is to blame (`diagnose`,
MINIFY_CAPTURE_DIAGNOSE=1).

The spec records the backend, every inductor, dynamo and functorch setting that differs from its
default (`config`), and the failure's kind and root-cause signature. torch is imported only when a
capture block is entered or something is captured: the rest of the client imports without it.
"""

from __future__ import annotations

from .block import capture_failures
from .config import CONFIG_MODULES, changed_config, config_values
from .destinations import DEFAULT_CAPTURE_DIR, Captured
from .session import CaptureSession, read_manifest
from .whole_model import capture

__all__ = [
    "CONFIG_MODULES",
    "DEFAULT_CAPTURE_DIR",
    "CaptureSession",
    "Captured",
    "capture",
    "capture_failures",
    "changed_config",
    "config_values",
    "read_manifest",
]
