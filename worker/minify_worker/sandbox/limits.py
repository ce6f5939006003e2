"""What a sandbox child may use and see: its memory bound, its resource limits (core dumps, open
files, address space), the environment it inherits, and how many candidates one long-lived child runs."""

from __future__ import annotations

import os
import re
import resource
import tempfile
from pathlib import Path

from minify_contract.models import MAX_PARALLELISM, JobSpec

CHILD_OPEN_FILES = 4096
# A torch child maps about 1 GB of address space it never touches (libraries, arenas, stacks): the
# address-space bound is the memory bound plus this.
ADDRESS_SPACE_SLACK_MB = 4096
# The address-space bound (MiB) children of CPU jobs get, set by the pool in the server's environment.
ADDRESS_SPACE_ENV = "MINIFY_SANDBOX_ADDRESS_SPACE_MB"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# The worker's parallelism for jobs that set none (`minify-worker --parallelism` sets it for its work horses).
PARALLELISM_ENV = "MINIFY_PARALLELISM"


def worker_parallelism() -> int | None:
    """`MINIFY_PARALLELISM`: the children at once of a job that sets no parallelism, on a worker that
    shares its machine's cores (several workers, or other work beside it): where the cores are
    busy, a second child runs candidates the reduction may never need, on CPU the others wanted.
    None when unset; a value that is not a whole number from 1 to `MAX_PARALLELISM` (the spec's own range) is a
    ValueError that says so."""
    value = os.environ.get(PARALLELISM_ENV, "").strip()
    return parallelism_of(value, PARALLELISM_ENV) if value else None


def parallelism_of(value: str, source: str) -> int:
    """`value` as a count of children at once: a whole number from 1 to `MAX_PARALLELISM` (the spec's own range);
    else a ValueError that names `source` (the variable, or the flag that sets it)."""
    value = value.strip()
    if not value.isdigit() or not 1 <= int(value) <= MAX_PARALLELISM:
        raise ValueError(f"{source} must be a whole number from 1 to {MAX_PARALLELISM}, not {value!r}")
    return int(value)


def machine_memory_mb() -> int:
    """The machine's memory (MiB), or its cgroup's limit when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit) // (1 << 20)) if limit.isdigit() else total


def default_memory_bound_mb(parallelism: int) -> int:
    """Each candidate's share of the machine: 80 % of its memory over the children at once."""
    return max(512, int(machine_memory_mb() * 0.8 / max(1, parallelism)))


def default_reuse(spec: JobSpec) -> int:
    """Candidates per long-lived child: `MINIFY_SANDBOX_REUSE` if set, else 0 (a fresh child per
    candidate) on every device. A child forked from the warm server starts warm, on the CPU and on
    CUDA alike (it pays only its CUDA context there); long-lived children measured slower on both
    (an H200: transformer_layer 11.9 s fresh against 15.2 s reusing 50, relu_cos 4.2 s against
    5.7 s; docs/bench.md). `spec` is where a device that needs reuse would say so."""
    configured = os.environ.get("MINIFY_SANDBOX_REUSE", "").strip()
    if configured:
        return max(0, int(configured))
    return 0


# What a child inherits of the worker's environment is scrubbed of these: the sandbox runs code the
# program brings (a custom backend, pickles the operator allowed), and it has no use for secrets.
_SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|AUTH)|"
    r"^(AWS_|AZURE_|GOOGLE_|GCP_|GCLOUD_|CLOUDSDK_|REDIS|RQ_|MINIFY_REDIS|DATABASE_URL|SENTRY_DSN)"
)


def scrubbed_environment(environment: dict[str, str]) -> dict[str, str]:
    """`environment` without what a sandbox child must not see: tokens, passwords, cloud credentials,
    the Redis URL (it may carry a password)."""
    return {name: value for name, value in environment.items() if not _SECRET_NAME.search(name.upper())}


def confine_child(tmp: Path, spec: JobSpec) -> None:
    """A child's own temp dir and resource limits: no core dumps, a bounded number of open files,
    and on CPU jobs a bound on address space (CUDA maps far more address space than it uses, so
    cuda jobs rely on the server's resident-memory watch alone)."""
    tmp.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = None
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = CHILD_OPEN_FILES if hard == resource.RLIM_INFINITY else min(CHILD_OPEN_FILES, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    bound = os.environ.get(ADDRESS_SPACE_ENV)
    if bound and spec.device_class == "cpu":
        limit = int(bound) << 20
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or limit < hard:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit if hard == resource.RLIM_INFINITY else hard))
