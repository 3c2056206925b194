"""What bounds the ring's memory: the container's memory limit, the machine's available
memory, and, for the POSIX backend only, the free space of /dev/shm.

Shared memory is memory. A segment's pages, memfd or /dev/shm alike, are charged to the
memory cgroup of the process that reserves them (the main process) and taken from the
machine's RAM; a ring that outgrows either gets its process killed by the OOM killer, or
by SIGBUS on a full tmpfs. So the default bound (``max_shm_bytes=None``) is read from what
really limits memory here, once the loader's own segments exist (NOTE [ The default bound
leaves out the loader's own segments ], session.py):

* the memory cgroup's limit less its use, at every level up to the root of the hierarchy
  this process sees (a container's limit is often set on a parent): cgroup v2
  ``memory.max`` less ``memory.current``, v1 ``memory.limit_in_bytes`` less
  ``memory.usage_in_bytes``. The use leaves out the file cache (``active_file`` and
  ``inactive_file``), which the kernel reclaims before it kills anything: a job that
  reads its dataset through the page cache fills its cgroup to the limit with it, and is
  not out of memory. Shared memory (memfd, tmpfs) is not on those lists: it counts;
* ``MemAvailable`` from /proc/meminfo;
* for the POSIX backend, the free space of /dev/shm (the ring's segments are files there).

NOTE [ The ring takes at most half the memory left ]
Of the memory left under the tighter of the first two, the ring may take half: the other
half is the training process's own (its model, the copies of batches it keeps, page-locked
buffers) and the workers'. Taking all of it would trade a clear RingFullError for the OOM
killer. /dev/shm's free space is for shared memory only, so all of it counts.

Everything here reads files, never raises, and takes the paths it reads as arguments, so
the unit tests give it fake cgroup trees.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from .._core._units import binary_size

SHM_DIR = "/dev/shm"
PROC_SELF = "/proc/self"  # where this process's cgroup and mounts are read (tests point these elsewhere)
MEMINFO = "/proc/meminfo"
MEMORY_SHARE = 2  # the ring may take 1/MEMORY_SHARE of the memory left (NOTE above)
UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a number near 2**63
CONTAINER_REMEDY = ("give the container more memory (docker run --memory=..., the pod's "
                    "resources.limits.memory)")
MACHINE_REMEDY = "free memory on this machine (other programs use it)"


class Bound(NamedTuple):
    """A bound on the ring's bytes, where it came from and what raises it (for messages)."""
    bytes: int
    source: str  # "half the memory left under the container's limit (cgroup v2 memory.max ...)"
    remedy: str  # "give the container more memory (docker run --memory=...)"
    harm: str = ""  # what going past it does, where a shortage() says


class Limit(NamedTuple):
    """A memory limit and what is left under it."""
    left: int
    text: str  # "cgroup v2 memory.max 1.00 GiB, 600.00 MiB in use"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _number(path: str) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None  # "max" (cgroup v2's no limit), or something unreadable


def _stat_sum(path: str, keys: tuple[str, ...]) -> int:
    """The sum of ``keys``' values in a memory.stat file (0 for those absent)."""
    total = 0
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name in keys and value.strip().isdigit():
            total += int(value)
    return total


# cgroup v2 and v1 name the same facts differently: (limit, use, stat keys of the file cache)
_FILES = {2: ("memory.max", "memory.current", ("active_file", "inactive_file")),
          1: ("memory.limit_in_bytes", "memory.usage_in_bytes", ("total_active_file", "total_inactive_file"))}


def _unescape(path: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are written as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


def _memory_mounts(mountinfo: str) -> list[tuple[int, str, str]]:
    """(cgroup version, mount point, root of the hierarchy mounted there) of the mounts
    that hold the memory controller: v1 first, since a controller a v1 hierarchy holds is
    not in the unified one."""
    found = []
    for line in (_read(mountinfo) or "").splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 5 or len(fields) < sep + 2:
            continue
        fstype = fields[sep + 1]
        options = fields[sep + 3].split(",") if len(fields) > sep + 3 else []
        if fstype == "cgroup" and "memory" in options:
            found.append((1, _unescape(fields[4]), _unescape(fields[3])))
        elif fstype == "cgroup2":
            found.append((2, _unescape(fields[4]), _unescape(fields[3])))
    return sorted(found, key=lambda m: m[0])


def _cgroup_path(cgroup: str, version: int) -> str | None:
    """This process's cgroup in the hierarchy of ``version`` (/proc/self/cgroup)."""
    for line in (_read(cgroup) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if (version == 2 and parts[0] == "0" and parts[1] == "") or \
                (version == 1 and "memory" in parts[1].split(",")):
            return parts[2]
    return None


def cgroup_limit(proc_self: str | None = None) -> Limit | None:
    """The tightest memory limit of this process's cgroup and its ancestors (None where
    there is none, or no cgroup with the memory controller)."""
    proc_self = proc_self or PROC_SELF
    for version, mount, root in _memory_mounts(os.path.join(proc_self, "mountinfo")):
        path = _cgroup_path(os.path.join(proc_self, "cgroup"), version)
        if path is None:
            continue
        # In a container with its own cgroup namespace the path is "/" and the mount is
        # the container's own cgroup; without one, the path is the host's and the mount's
        # root says which part of it is mounted.
        rel = os.path.relpath(path, root) if path == root or path.startswith(root.rstrip("/") + "/") else "."
        here = os.path.normpath(os.path.join(mount, rel))
        if not os.path.isdir(here) or not (here + "/").startswith(os.path.normpath(mount).rstrip("/") + "/"):
            here = mount
        found = _tightest(version, mount, here)
        if found is not None:  # (else another mount may hold it: a hierarchy can be mounted twice)
            return found
    return None


def _tightest(version: int, mount: str, here: str) -> Limit | None:
    limit_file, use_file, cache_keys = _FILES[version]
    best: Limit | None = None
    while True:
        limit = _number(os.path.join(here, limit_file))
        use = _number(os.path.join(here, use_file))
        if limit is not None and limit < UNLIMITED and use is not None:
            used = max(0, use - _stat_sum(os.path.join(here, "memory.stat"), cache_keys))
            left = max(0, limit - used)
            if best is None or left < best.left:
                best = Limit(left, f"cgroup v{version} {limit_file} {binary_size(limit)}, "
                                   f"{binary_size(used)} in use")
        up = os.path.dirname(here)
        if os.path.normpath(here) == os.path.normpath(mount) or up == here:
            return best
        here = up


def mem_available(meminfo: str | None = None) -> int | None:
    """The kernel's estimate of the memory available without swapping (bytes)."""
    for line in (_read(meminfo or MEMINFO) or "").splitlines():
        if line.startswith("MemAvailable:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1]) * 1024
    return None


def shm_free(shm_dir: str | None = None) -> int | None:
    """The bytes free in /dev/shm (None if it is not there)."""
    try:
        st = os.statvfs(shm_dir or SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


# NOTE [ Check the room before reserving ]
# posix_fallocate turns a full tmpfs into ENOSPC, but not a full memory cgroup: reserving
# past the container's limit has the kernel's OOM killer end the process (SIGKILL, seen
# with a memfd segment of 200 MiB in a 100 MiB cgroup), and past the machine's memory it
# may end another. The default bound keeps the ring well inside both, but an explicit
# max_shm_bytes, or memory the job took since the bound was read, does not. So every
# segment is checked against the memory left right now before it is reserved: a few
# small files read per segment, and segments are few (O(log n) per ring).
def shortage(size: int, proc_self: str | None = None, meminfo: str | None = None) -> Bound | None:
    """The limit that ``size`` more bytes of memory would exceed now (as a Bound: what is
    left, which limit, what raises it), or None if there is room."""
    lim = cgroup_limit(proc_self)
    if lim is not None and size > lim.left:
        return Bound(lim.left, f"the container's memory limit: {lim.text}", CONTAINER_REMEDY,
                     "have the kernel's OOM killer end the process")
    available = mem_available(meminfo)
    if available is not None and size > available:
        return Bound(available, f"this machine's available memory (MemAvailable {binary_size(available)})",
                     MACHINE_REMEDY,
                     "push the machine into swap, or have its OOM killer end a process")
    return None


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_bound(backend: str, proc_self: str | None = None, meminfo: str | None = None,
                  shm_dir: str | None = None) -> Bound:
    """The ring's default bound for segments of ``backend`` ("memfd" or "posix")."""
    candidates = []
    lim = cgroup_limit(proc_self)
    if lim is not None:
        candidates.append(Bound(lim.left // MEMORY_SHARE, "half the memory left under the container's limit when "
                                f"the workers started: {lim.text}", CONTAINER_REMEDY))
    available = mem_available(meminfo)
    if available is None:
        total = physical_memory()
        candidates.append(Bound(total // MEMORY_SHARE, f"half of this machine's memory ({binary_size(total)})",
                                "use a machine with more memory"))
    else:
        candidates.append(Bound(available // MEMORY_SHARE, "half of this machine's available memory when the "
                                f"workers started (MemAvailable {binary_size(available)})", MACHINE_REMEDY))
    if backend == "posix":
        free = shm_free(shm_dir)
        if free is not None:
            candidates.append(Bound(free, f"the free space of {shm_dir or SHM_DIR} when the workers started",
                                    f"more {shm_dir or SHM_DIR}: docker run --shm-size=..., or shm_backend='memfd', "
                                    "whose segments /dev/shm does not bound"))
    return min(candidates, key=lambda b: b.bytes)
