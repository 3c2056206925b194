"""The machine a benchmark ran on, and the CPU time of its child processes: shared by
every benchmark script, so their reports describe the machine the same way."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable

import psutil


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


def versions(distributions: Iterable[str]) -> dict[str, str | None]:
    """Installed versions, read from package metadata (nothing is imported: torch stays
    out of a process that does not use it)."""
    out: dict[str, str | None] = {}
    for dist in distributions:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def machine(distributions: Iterable[str]) -> dict[str, Any]:
    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
            "ram_gib": round(psutil.virtual_memory().total / 2**30, 1), "platform": platform.platform(),
            "python": platform.python_version(), "versions": versions(distributions),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def children_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's live children, recursively."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def child_result(module: str, child_args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """``python -m <module> --child ... --child-out FILE`` in a fresh process (from the
    checkout's root): the JSON it wrote, or ``{"error": ...}`` with its last line of stderr."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="shmload-bench-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", module, "--child", *child_args, "--child-out", str(out)]
        try:
            proc = subprocess.run(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        if proc.returncode != 0 or not out.exists():
            tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
            return {"error": f"exit code {proc.returncode}: {tail[0][:300]}"}
        return json.loads(out.read_text())
