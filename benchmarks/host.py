"""The machine a benchmark ran on, and the CPU time of its child processes: shared by
every benchmark script, so their reports describe the machine the same way."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
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
