"""Running where training runs: a container's 64 MB /dev/shm, its memory limit, and the
ring's default bound read from them (shmload/_transport/limits.py).

The unit tests give limits.py fake cgroup trees (v1, v2, nested, unlimited), and choose
between the two backends of shm.py: tests of internals (``shmload._transport.limits``
and ``shm``), on purpose. The scripts
run in a private /dev/shm (a mount namespace, as root) or a memory cgroup of their own
(as root, where this machine's cgroups can be written), and skip cleanly elsewhere.
"""

import errno
import os
import re

import numpy as np
import pytest

from shmload import DataLoader, RingFullError
from shmload._transport import limits

from .scripts import MemoryCgroup, can_unshare, describe, run_script, small_shm

MIB = 1 << 20
GIB = 1 << 30


def fake_machine(tmp_path, version: int, levels: dict, path: str = "/job/step", mount_root: str = "/",
                 available: int = 16 * GIB) -> str:
    """A fake /proc/self (returned) and cgroup tree under ``tmp_path``. ``levels`` maps a
    cgroup (relative to the mount) to (limit or None for none, use, file cache), the cache
    split between the active and the inactive list."""
    mount = tmp_path / "cgroup"
    proc = tmp_path / "proc"
    proc.mkdir()
    limit_file, use_file, cache_keys = limits._FILES[version]
    for rel, (limit, use, cache) in levels.items():
        d = mount / rel.strip("/") if rel.strip("/") else mount
        d.mkdir(parents=True, exist_ok=True)
        unlimited = "max" if version == 2 else "9223372036854771712"
        (d / limit_file).write_text(f"{unlimited if limit is None else limit}\n")
        (d / use_file).write_text(f"{use}\n")
        (d / "memory.stat").write_text(f"anon 1\n{cache_keys[0]} {cache // 2}\n{cache_keys[1]} {cache - cache // 2}\n"
                                       "file 2\nshmem 3\n")
    fs = "cgroup2 cgroup2 rw" if version == 2 else "cgroup cgroup rw,memory"
    (proc / "mountinfo").write_text(
        "22 1 8:1 / / rw,relatime - ext4 /dev/root rw\n"
        f"35 22 0:31 {mount_root} {mount} rw,nosuid - {fs}\n")
    (proc / "cgroup").write_text(f"0::{path}\n" if version == 2 else f"5:cpu:/\n4:memory:{path}\n")
    (tmp_path / "meminfo").write_text(f"MemTotal: 33554432 kB\nMemAvailable: {available // 1024} kB\n")
    return str(proc)


def bound(tmp_path, backend="memfd", shm_dir=None):
    return limits.default_bound(backend, proc_self=str(tmp_path / "proc"), meminfo=str(tmp_path / "meminfo"),
                                shm_dir=shm_dir)


@pytest.mark.pure
@pytest.mark.parametrize("version", [1, 2])
def test_the_tightest_limit_up_the_hierarchy_less_its_working_set(tmp_path, version):
    # the job's own cgroup has no limit; its parent (the container) has 1 GiB, of which
    # 900 MiB are used, 100 MiB of them file cache (reclaimable: not counted)
    fake_machine(tmp_path, version, {"/": (None, 5 * GIB, 0), "/job": (GIB, 900 * MIB, 100 * MIB),
                                     "/job/step": (None, 600 * MIB, 0)})
    name = "memory.max" if version == 2 else "memory.limit_in_bytes"
    assert limits.cgroup_limit(str(tmp_path / "proc")) == (224 * MIB, f"cgroup v{version} {name} 1.00 GiB, "
                                                                       "800.00 MiB in use")
    b = bound(tmp_path)
    assert b.bytes == 112 * MIB
    assert b.source == (f"half the memory left under the container's limit when the workers started: cgroup "
                        f"v{version} {name} 1.00 GiB, 800.00 MiB in use")
    assert "docker run --memory" in b.remedy


@pytest.mark.pure
@pytest.mark.parametrize("version", [1, 2])
def test_no_limit_leaves_the_machines_available_memory(tmp_path, version):
    fake_machine(tmp_path, version, {"/": (None, GIB, 0), "/job/step": (None, GIB, 0)}, available=6 * GIB)
    assert limits.cgroup_limit(str(tmp_path / "proc")) is None
    assert bound(tmp_path) == (3 * GIB, "half of this machine's available memory when the workers started "
                                        "(MemAvailable 6.00 GiB)", "free memory on this machine (other programs use it)", "")


@pytest.mark.pure
def test_available_memory_below_the_containers_limit_is_the_bound(tmp_path):
    fake_machine(tmp_path, 2, {"/": (None, 0, 0), "/job/step": (8 * GIB, GIB, 0)}, available=2 * GIB)
    assert bound(tmp_path).bytes == GIB and "MemAvailable 2.00 GiB" in bound(tmp_path).source


@pytest.mark.pure
def test_a_container_with_its_own_cgroup_namespace(tmp_path):
    # inside the namespace the path is "/" and the mount is the container's own cgroup
    fake_machine(tmp_path, 2, {"/": (512 * MIB, 112 * MIB, 0)}, path="/")
    assert bound(tmp_path).bytes == 200 * MIB


@pytest.mark.pure
def test_a_host_path_outside_the_mounted_part_falls_back_to_the_mount(tmp_path):
    # a container without a cgroup namespace sees the host's path, mounted from its own cgroup
    fake_machine(tmp_path, 1, {"/": (256 * MIB, 56 * MIB, 0)}, path="/kubepods/pod1/c1", mount_root="/kubepods/pod1/c1")
    assert bound(tmp_path).bytes == 100 * MIB
    other = tmp_path / "other"
    other.mkdir()
    fake_machine(other, 1, {"/": (256 * MIB, 56 * MIB, 0)}, path="/elsewhere", mount_root="/kubepods/pod1/c1")
    assert bound(other).bytes == 100 * MIB


@pytest.mark.pure
def test_odd_mount_lines_escaped_paths_and_paths_out_of_the_mount(tmp_path):
    # a mount point with a space (written \040), a line without super options, and a
    # cgroup path that leads out of the mount: read, skipped, and not followed
    mount = tmp_path / "my cg"
    (mount / "a").mkdir(parents=True)
    (mount / "memory.max").write_text(f"{GIB}\n")
    (mount / "memory.current").write_text("0\n")
    (tmp_path / "x").mkdir()
    proc = tmp_path / "proc"
    proc.mkdir()
    escaped = str(mount).replace(" ", "\\040")
    (proc / "mountinfo").write_text(f"30 22 0:30 / /elsewhere rw - cgroup2\n35 22 0:31 / {escaped} rw - cgroup2 c rw\n")
    (proc / "cgroup").write_text("0::/a/../../x\n")
    assert limits.cgroup_limit(str(proc)) == (GIB, "cgroup v2 memory.max 1.00 GiB, 0 B in use")


@pytest.mark.pure
def test_no_cgroup_files_at_all_is_not_an_error(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "meminfo").write_text("MemAvailable: 1048576 kB\n")
    assert limits.cgroup_limit(str(tmp_path / "proc")) is None and bound(tmp_path).bytes == 512 * MIB


@pytest.mark.pure
def test_dev_shm_bounds_only_the_posix_backend(tmp_path, monkeypatch):
    fake_machine(tmp_path, 2, {"/": (None, 0, 0), "/job/step": (None, 0, 0)}, available=64 * GIB)
    monkeypatch.setattr(limits, "shm_free", lambda shm_dir=None: 5 * GIB)
    posix = bound(tmp_path, "posix")
    assert posix.bytes == 5 * GIB and posix.source.startswith("the free space of /dev/shm")
    assert "--shm-size" in posix.remedy and "shm_backend='memfd'" in posix.remedy
    assert bound(tmp_path, "memfd").bytes == 32 * GIB


class Big:
    """Samples of 4 MiB: a batch of 4 needs a 16 MiB slot."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return np.full(4 * MIB, i % 251, np.uint8)


def test_a_limit_smaller_than_a_slot_is_a_clear_error_naming_it(tmp_path, monkeypatch):
    # 40 MiB, 20 in use: the ring may have 10 MiB, less than one 16 MiB slot
    proc = fake_machine(tmp_path, 2, {"/": (None, 0, 0), "/job/step": (40 * MIB, 20 * MIB, 0)})
    monkeypatch.setattr(limits, "PROC_SELF", proc)
    monkeypatch.setattr(limits, "MEMINFO", str(tmp_path / "meminfo"))
    loader = DataLoader(Big(), batch_size=4, num_workers=2, timeout=30)
    with pytest.raises(RingFullError, match=re.escape(
            "over its bound of 10.00 MiB (half the memory left under the container's limit when the workers "
            "started: cgroup v2 memory.max 40.00 MiB, 20.00 MiB in use)") + r".*max_shm_bytes=, or give the "
            r"container more memory \(docker run --memory=\.\.\., the pod's resources\.limits\.memory\)"):
        next(iter(loader))
    loader.close()


CGROUP_SCRIPT = """
import sys, numpy as np, shmload
mib = int(sys.argv[1])
class Samples:
    def __len__(self): return 32
    def __getitem__(self, i): return np.full(mib << 20, i % 251, np.uint8)
loader = shmload.DataLoader(Samples(), batch_size=4, num_workers=2, timeout=30)
got = 0
try:
    for b in loader:
        assert (b[:, 0] == np.arange(4 * got, 4 * got + 4) % 251).all() and (b[:, -1] == b[:, 0]).all()
        got += 1
    print("finished", got)
except shmload.ShmloadError as exc:
    print("after", got, type(exc).__name__, exc)
"""


@pytest.mark.skipif(not MemoryCgroup.available(), reason="needs root and a writable memory cgroup")
def test_in_a_memory_cgroup_the_bound_is_its_limit_and_what_fits_loads():
    with MemoryCgroup("256M") as cg:
        big = run_script(["-c", CGROUP_SCRIPT, "32"], timeout=60, prefix=cg.prefix)  # 128 MiB slots
        small = run_script(["-c", CGROUP_SCRIPT, "2"], timeout=60, prefix=cg.prefix)
    assert big.returncode == 0 and small.returncode == 0, describe(big) + describe(small)
    assert re.search(r"^after 0 RingFullError .*over its bound of \d+\.\d\d MiB \(half the memory left under the "
                     r"container's limit when the workers started: cgroup v[12] memory\.(limit_in_bytes|max) "
                     r"256\.00 MiB, .* in use\).*docker run --memory", big.stdout), describe(big)
    assert small.stdout == "finished 8\n", describe(small)


IMAGENET_SCRIPT = """
import os, threading, numpy as np, shmload
seen, stop = set(), threading.Event()
def watch():
    while not stop.is_set():
        seen.update(os.listdir("/dev/shm"))
        stop.wait(0.001)
watcher = threading.Thread(target=watch)
watcher.start()

class ImageNetShaped:  # what a decode + crop to 224x224 hands the collate
    def __len__(self): return 6 * 256
    def __getitem__(self, i): return np.full((224, 224, 3), i % 251, np.uint8), i

loader = shmload.DataLoader(ImageNetShaped(), batch_size=256, num_workers=4, timeout=60)
got = 0
for images, labels in loader:
    expected = np.arange(256 * got, 256 * got + 256)
    assert (labels == expected).all() and (images[:, 0, 0, 0] == expected % 251).all()
    assert (images[:, 223, 223, 2] == expected % 251).all()
    got += 1
stop.set()
watcher.join()
print("finished", got, "seen", sorted(seen), "free", os.statvfs("/dev/shm").f_bfree * os.statvfs("/dev/shm").f_frsize)
"""


@pytest.mark.skipif(not can_unshare(), reason="needs root and unshare to mount a private 64 MB /dev/shm")
@pytest.mark.timeout(120)
def test_an_imagenet_shaped_loader_runs_in_a_containers_default_dev_shm():
    # Docker's and Kubernetes' default: 64 MB. A batch is 36.75 MiB; with the defaults the
    # ring wants 8 of them. /dev/shm stays empty throughout: nothing of the loader is there.
    result = run_script(["-c", IMAGENET_SCRIPT], timeout=100, prefix=small_shm("64m"))
    assert result.returncode == 0, describe(result)  # (a SIGBUS would be -7)
    assert result.stdout.startswith("finished 6 seen [] free 67108864"), describe(result)


class Small:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.full(4, i, np.int64)


@pytest.mark.pure
def test_a_wrong_backend_is_a_clear_error_from_the_argument_or_the_environment(monkeypatch):
    with pytest.raises(ValueError, match=r"^shm_backend should be 'memfd' or 'posix' \(or unset: memfd where the "
                                         r"kernel has it\), but got 'tmpfs'$"):
        DataLoader(Small(), shm_backend="tmpfs")
    monkeypatch.setenv("SHMLOAD_SHM_BACKEND", "shm")
    with pytest.raises(ValueError, match=r"^\$SHMLOAD_SHM_BACKEND should be 'memfd' or 'posix'.*but got 'shm'$"):
        DataLoader(Small())


@pytest.mark.pure
def test_without_memfd_the_default_is_posix_and_asking_for_memfd_says_why(monkeypatch):
    from shmload import SharedMemoryError
    from shmload._transport import shm

    monkeypatch.setattr(shm, "memfd_supported", lambda: False)
    assert shm.resolve_backend(None) == "posix"
    with pytest.raises(SharedMemoryError, match=r"shm_backend='memfd', but this system cannot make memfd segments "
                                                r"\(os\.memfd_create is missing, or the kernel refused it: it needs "
                                                r"Linux 3\.17 or later, and a sandbox may forbid it\): use "
                                                r"shm_backend='posix'"):
        DataLoader(Small(), shm_backend="memfd")


@pytest.mark.pure
@pytest.mark.parametrize("code,kept", [(errno.ENOSYS, False), (errno.EMFILE, None)])
def test_only_the_kernels_refusal_turns_memfd_off_for_good(monkeypatch, code, kept):
    from shmload._transport import shm

    def fails(name, flags):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(shm, "_memfd", None)
    monkeypatch.setattr(os, "memfd_create", fails)
    assert shm.memfd_supported() is (kept is not False) and shm._memfd is kept


@pytest.mark.pure
def test_a_segment_past_the_memory_left_is_refused_before_it_is_reserved(tmp_path, monkeypatch):
    # reserving it would have the OOM killer end the process (NOTE [ Check the room before reserving ])
    from shmload import SharedMemoryError
    from shmload._transport import shm

    proc = fake_machine(tmp_path, 2, {"/": (None, 0, 0), "/job/step": (40 * MIB, 20 * MIB, 0)})
    monkeypatch.setattr(limits, "PROC_SELF", proc)
    monkeypatch.setattr(limits, "MEMINFO", str(tmp_path / "meminfo"))
    with pytest.raises(SharedMemoryError, match=re.escape(
            "could not reserve 32.00 MiB of shared memory for the loader's ring: only 20.00 MiB are left under the "
            "container's memory limit: cgroup v2 memory.max 40.00 MiB, 20.00 MiB in use. Reserving more would have "
            "the kernel's OOM killer end the process. Give the container more memory (docker run --memory=...")):
        shm.Segment(0, 32 * MIB)
    shm.Segment(0, 16 * MIB).close()  # what fits is reserved


@pytest.mark.skipif(not MemoryCgroup.available(), reason="needs root and a writable memory cgroup")
def test_an_explicit_bound_past_the_containers_limit_is_an_error_not_the_oom_killer():
    script = CGROUP_SCRIPT.replace("timeout=30)", "timeout=30, max_shm_bytes=4 << 30)")
    with MemoryCgroup("256M") as cg:
        result = run_script(["-c", script, "32"], timeout=60, prefix=cg.prefix)  # 128 MiB slots
    assert result.returncode == 0, describe(result)  # -9: the OOM killer
    assert re.search(r"^after [01] (SharedMemoryError|RingFullError) .*are left under the container's memory "
                     r"limit: cgroup v[12] memory\.(limit_in_bytes|max) 256\.00 MiB", result.stdout), describe(result)


@pytest.mark.parametrize("backend", [None, pytest.param("posix", marks=pytest.mark.shm_names)])
def test_the_profile_and_repr_say_which_backend_is_in_use(monkeypatch, backend):
    if backend:
        monkeypatch.setenv("SHMLOAD_SHM_BACKEND", backend)
    else:
        monkeypatch.delenv("SHMLOAD_SHM_BACKEND", raising=False)
    with DataLoader(Small(), batch_size=4, num_workers=1, timeout=30, persistent_workers=True) as loader:
        assert [b[:, 0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        stats = loader.stats(memory=False)
        assert stats.shm_backend == (backend or "memfd") and loader.shm_backend is None
        assert re.search(rf"^shmload profile: .*usable cores, {backend or 'memfd'} segments, {stats.core} core$",
                         str(stats), re.M)
        assert f"({backend or 'memfd'} segments, bound " in repr(loader)
        loader.shm_backend = "memfd" if backend else "posix"  # for the next iter(): the live ring's is reported
        assert loader.stats(memory=False).shm_backend == (backend or "memfd")
    assert DataLoader(Small(), batch_size=4).stats().shm_backend is None  # no workers: no shared memory
