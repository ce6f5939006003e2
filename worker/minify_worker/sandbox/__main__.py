"""`python -m minify_worker.sandbox`: the fork server, spawned by a `SandboxPool` (see `server.py`)."""

import os
import sys

from .server import server_main

if __name__ == "__main__":
    code = server_main()
    sys.stderr.flush()
    os._exit(code)  # skip torch's and inductor's exit handlers: nothing of theirs needs to run here
