"""Peak memory of a process tree, sampled from outside: the sum of PSS over its processes.

PSS (proportional set size) charges each shared page to the processes mapping it in
equal parts, so the sum over a loader's main process and its workers counts shared
memory (the ring, torch's per-batch segments, libraries inherited by fork) exactly once.
Sampling from the orchestrator keeps the measured processes free of a sampling thread,
but it still takes CPU from them: reading the PSS of a loader's three processes costs
about 6 ms (the kernel walks their page tables), so sampling every 50 ms took ~12% of a
core from the loaders being measured. Every 250 ms it takes ~2%; memory here changes
slowly (rings and pools are steady after the first batches), so the peak is still seen.
"""

from __future__ import annotations

import threading

import psutil


def tree_pss(pid: int) -> int:
    """Sum of PSS in bytes over ``pid`` and its descendants (0 if it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:
            continue  # exited between the listing and the read
    return total


class PeakSampler:
    """Samples ``tree_pss(pid)`` every ``interval`` seconds on a thread until stopped."""

    def __init__(self, pid: int, interval: float = 0.25):
        self.pid, self.interval = pid, interval
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_pss(self.pid))
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

