"""Sizes for people, in two systems, each named for the one it uses.

* :func:`binary_size` (KiB, MiB, GiB: powers of 1024) in errors and advice, where the
  figure is compared with what the kernel and the user's settings count in pages and
  powers of two (``max_shm_bytes``, cgroup limits, ``--shm-size=64m``);
* :func:`decimal_size` and :func:`decimal_rate` (kB, MB, GB: powers of 1000) in the
  profiler's report, as throughputs are quoted (MB/s, GB/s).
"""

from __future__ import annotations


def binary_size(n: float) -> str:
    """``n`` bytes in binary units: 512 B, 32.0 KiB, 9.19 MiB, 1.50 GiB."""
    for unit, scale, digits in (("GiB", 2**30, 2), ("MiB", 2**20, 2), ("KiB", 2**10, 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{int(n)} B"


def decimal_size(n: float) -> str:
    """``n`` bytes in decimal units: 512 B, 32.0 kB, 9.6 MB, 1.50 GB."""
    for unit, scale, digits in (("GB", 1e9, 2), ("MB", 1e6, 1), ("kB", 1e3, 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{int(n)} B"


def decimal_rate(bytes_per_second: float) -> str:
    """A throughput in decimal units: 147.6 MB/s, 11.00 GB/s."""
    return decimal_size(bytes_per_second) + "/s"
