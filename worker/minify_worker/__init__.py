"""minify's worker: the RQ job entry, the minimization engine and the sandbox (docs/architecture.md).

Importing this package sets `PYTORCH_NVML_BASED_CUDA_CHECK=1` (unless the environment says
otherwise): with it, `torch.cuda.is_available()` and `device_count()` ask NVML instead of
initializing CUDA, so a process that asked can still fork children that use CUDA. Without it, one
`is_available()` in a worker, an engine or a fork server makes CUDA unusable in every forked child
("Cannot re-initialize CUDA in forked subprocess"). torch reads it at each call, so this must run
before the first `is_available()`, not necessarily before `import torch`; every entry point that
may fork imports this package first.
"""

import os

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
