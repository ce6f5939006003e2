"""A spy on CUDA initialization, for the test that no process that forks candidates touches CUDA.

On PYTHONPATH with MINIFY_CUDA_SPY_LOG set, every Python process of the test (the engine, its fork
server, its children, whether forked or spawned) imports this at start. Once torch is imported it
makes `torch.cuda.is_available()` say True (a machine with a GPU, as far as the code can tell) and
wraps everything that would initialize CUDA: each call appends "pid session-leader name" to the
log, then goes on as before. Sandbox children are session leaders (setsid); the engine, the fork
server and its guardian are not.
"""

import importlib.machinery
import os
import sys

LOG = os.environ.get("MINIFY_CUDA_SPY_LOG")
WATCHED = {
    "torch.cuda": ("_lazy_init", "init", "get_rng_state", "get_rng_state_all", "set_rng_state", "manual_seed",
                   "manual_seed_all", "current_device", "set_device", "synchronize", "get_device_properties",
                   "mem_get_info", "current_stream"),
    "torch._C": ("_cuda_init",),
}


def _record(name):
    pid = os.getpid()
    line = f"{pid} {int(os.getsid(0) == pid)} {name}\n"
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _spy(owner, module_name, name):
    original = getattr(owner, name, None)

    def spied(*args, **kwargs):
        _record(f"{module_name}.{name}")
        if original is None:
            raise RuntimeError(f"{module_name}.{name} is not in this build")
        return original(*args, **kwargs)

    setattr(owner, name, spied)


def _install(torch):
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    for module_name, names in WATCHED.items():
        owner = sys.modules[module_name]
        for name in names:
            _spy(owner, module_name, name)


class _AfterTorchImport:
    """Runs `_install` right after `import torch` completes, in whatever process imports it."""

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _install(module)

        spec.loader.exec_module = exec_module
        return spec


if LOG:
    sys.meta_path.insert(0, _AfterTorchImport())
