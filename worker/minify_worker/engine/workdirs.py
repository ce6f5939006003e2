"""Work folders in the temp dir (a job's `minify-job-*`, a version probe's `minify-version-probe-*`),
each marked with the process that made it.

The engine removes its folder when a run ends, a probe its own; a process killed hard (a SIGKILLed
work horse, the OOM killer) cannot. A worker removes such leftovers when it starts and after a work
horse dies, and a probe those of earlier probes: only folders whose owner is dead, read from the
mark, so workers sharing one machine never delete each other's live folders. A folder without a
mark is left alone (someone else's, or being made).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "minify-job-"
PROBE_PREFIX = "minify-version-probe-"
OWNER_FILE = ".minify-owner"


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): with the pid, it names one process, even
    after the pid is reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def make_job_dir(prefix: str = PREFIX) -> Path:
    """A new private work folder in the temp dir, marked with this process."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    (folder / OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
    return folder


def _owner_dead(folder: Path) -> bool:
    try:
        pid, started = (folder / OWNER_FILE).read_text().split()
        return started != "None" and _start_time(int(pid)) != started
    except (OSError, ValueError):
        return False


def remove_stale_job_dirs(temp_dir: Path | None = None,
                          prefixes: tuple[str, ...] = (PREFIX, PROBE_PREFIX)) -> list[Path]:
    """Remove this user's work folders (jobs', probes') whose owning process is dead; returns the
    folders removed."""
    root = Path(temp_dir or tempfile.gettempdir())
    removed = []
    for folder in [folder for prefix in prefixes for folder in root.glob(f"{prefix}*")]:
        try:
            info = folder.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and _owner_dead(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    if removed:
        log.info("removed %d job folder(s) left by dead processes: %s", len(removed),
                 ", ".join(str(folder) for folder in removed))
    return removed
