"""`capture_failures`: a `with` block (or decorator) whose failure becomes a job or files.

When a compiler call failed in the block, the graph that failed is captured (`failed_graph`);
when none did (an error raised outside compiled code), the whole model is exported with the real
inputs (`whole_model`). The original error is re-raised with a note saying where it went.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from contextlib import ContextDecorator
from types import TracebackType
from typing import Any

from minify_client.client import Client
from minify_contract.models import JobSpec

from .config import config_values
from .destinations import Captured, add_note, resolve, save_and_submit
from .failed_graph import exported
from .torch_hooks import FailedCompile, Level, add_listener, remove_listener
from .whole_model import capture, default_name

logger = logging.getLogger(__name__)


class capture_failures(ContextDecorator):  # lower case: it reads as a function at the call site
    """Capture the program when the block (or decorated function) raises one of `exceptions`,
    then re-raise the original error. A capture that itself fails is logged and noted on the
    original error; it never replaces it. `level="aot"` captures the graph inductor received
    (after AOT autograd) instead of the one dynamo handed the backend; a failing backward graph is
    captured at that level always. `accuracy=True` also compares each compiled graph's outputs
    with eager and captures a mismatch, though nothing raised."""

    def __init__(
        self,
        model: Any,
        args: Sequence[Any],
        kwargs: dict[str, Any] | None = None,
        *,
        spec: JobSpec | dict[str, Any] | None = None,
        name: str | None = None,
        submit_to: str | Client | None = None,
        token: str | None = None,
        save_to: str | os.PathLike[str] | None = None,
        exceptions: tuple[type[BaseException], ...] = (Exception,),
        level: Level = "dynamo",
        accuracy: bool = False,
    ) -> None:
        self._model = model
        self._args = args
        self._kwargs = kwargs
        self._spec = spec
        self._name = name
        self._destination: dict[str, Any] = {"submit_to": submit_to, "token": token, "save_to": save_to}
        self._exceptions = exceptions
        self.level: Level = level
        self.accuracy = accuracy
        self.captured: Captured | None = None
        self.capture_error: Exception | None = None
        self._failed: list[FailedCompile] = []
        self._config_at_compile: dict[str, Any] | None = None  # config_values() at the last compile

    def on_failure(self, failed: FailedCompile) -> None:
        self._failed.append(failed)

    def __enter__(self) -> capture_failures:
        from torch._dynamo.callback import callback_handler

        self._failed = []
        add_listener(self)
        # For the whole-model fallback: a config.patch inside the block is undone by the time the
        # block ends, so the config is read when a compile starts too.
        callback_handler.register_start_callback(self._on_compile_start)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> bool:
        from torch._dynamo.callback import callback_handler

        remove_listener(self)
        if self._on_compile_start in callback_handler.start_callbacks:  # torch._dynamo.reset() clears them
            callback_handler.remove_start_callback(self._on_compile_start)
        config_at_compile, self._config_at_compile = self._config_at_compile, None
        failed, self._failed = _the_failure(self._failed, error), []
        if error is None and failed is not None and failed.kind == "accuracy":
            # A wrong result raises nothing: the mismatch the check found is the failure to capture.
            self._capture_quietly(failed)
            return False
        if error is None or not isinstance(error, self._exceptions):
            return False
        try:
            if failed is not None:
                self.captured = self._capture_graph(failed)
            else:
                self.captured = capture(self._model, self._args, self._kwargs, spec=self._spec, name=self._name,
                                        config=config_at_compile, **self._destination)
        except Exception as capture_error:
            self.capture_error = capture_error
            logger.warning("minify: could not capture the failing program: %s", capture_error)
            add_note(error, f"minify: could not capture the failing program: {capture_error}")
        else:
            add_note(error, self.captured.describe())
        return False

    def _capture_quietly(self, failed: FailedCompile) -> None:
        try:
            self.captured = self._capture_graph(failed)
        except Exception as capture_error:
            self.capture_error = capture_error
            logger.warning("minify: could not capture the failing program: %s", capture_error)

    def _capture_graph(self, failed: FailedCompile) -> Captured:
        program = exported(failed, self._spec)
        name = self._name or default_name(self._model)
        destination, submit_to = resolve(name, self._destination["submit_to"], self._destination["save_to"])
        return save_and_submit(program.program, program.args, program.kwargs, program.spec, name=name,
                               destination=destination, submit_to=submit_to, token=self._destination["token"],
                               chain=program.chain)

    def _on_compile_start(self, _: Any) -> None:
        self._config_at_compile = config_values()


def _the_failure(failed: list[FailedCompile], error: BaseException | None) -> FailedCompile | None:
    """The failing call whose error the block raised (else the last one reported)."""
    if not failed:
        return None
    chain: list[BaseException] = []
    current: Any = error
    while isinstance(current, BaseException) and current not in chain and len(chain) < 16:
        chain.append(current)
        current = current.__cause__ or current.__context__
    for candidate in reversed(failed):
        if any(candidate.error is link for link in chain):
            return candidate
    return failed[-1]
