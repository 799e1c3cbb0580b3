"""What every benchmark records about where and when it ran, and how it writes its results.

Run benchmarks from the repository root (``python -m benchmarks.<name>`` or ``python benchmarks/<name>.py``);
results go to ``benchmarks/results/<name>-<date>.json`` (plus plots beside them).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"


def cpu_name() -> str | None:
    """The CPU model from /proc/cpuinfo ("model name"), or platform.processor() elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def cpu_count() -> int | None:
    return os.cpu_count()


def gpu_names() -> list[str]:
    """Names of the NVIDIA GPUs nvidia-smi reports (empty when there is no nvidia-smi or no GPU)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0:
        return []
    return [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]


def git_commit(repo: Path = REPO_ROOT) -> str | None:
    """``git rev-parse HEAD`` of the repository (None outside git or before the first commit)."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def git_dirty(repo: Path = REPO_ROOT) -> bool | None:
    """Whether tracked files differ from HEAD (None when unknown)."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return bool(proc.stdout.strip()) if proc.returncode == 0 else None


def today() -> str:
    return _dt.date.today().isoformat()


def machine_info() -> dict[str, Any]:
    """Machine, date and code version for a benchmark's JSON."""
    from gensorage import __version__

    gpus = gpu_names()
    info: dict[str, Any] = {
        "cpu": cpu_name(),
        "cpu_count": cpu_count(),
        "gpu": gpus[0] if gpus else None,
        "gpus": gpus,
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "gensorage_version": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    try:
        import tvm

        info["tvm"] = str(tvm.__version__)
    except ImportError:
        info["tvm"] = None
    return info


def result_path(name: str, suffix: str = ".json", directory: Path | None = None) -> Path:
    """``benchmarks/results/<name>-<YYYY-MM-DD><suffix>``."""
    return (directory or RESULTS_DIR) / f"{name}-{today()}{suffix}"


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON atomically (a reader never sees a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def progress(msg: str) -> None:
    """Progress line on stderr."""
    print(msg, file=sys.stderr, flush=True)


def time_calls(owner: Any, attr: str, times: dict[str, float], key: str | Callable[..., str]) -> None:
    """Wrap ``owner.attr`` so that each call's wall time adds up in ``times[key]`` (``key(*args, **kwargs)``
    where it is a function of the call)."""
    fn = getattr(owner, attr)
    key_of = key if callable(key) else (lambda *args, **kwargs: key)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            at = key_of(*args, **kwargs)
            times[at] = times.get(at, 0.0) + time.perf_counter() - t0

    setattr(owner, attr, timed)
