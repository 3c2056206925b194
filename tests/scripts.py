"""Running an example as a user would: ``python script ...`` in a session of its own.

Shared by the example tests. On a time-out the whole session (the script, its workers,
torchrun's ranks) is killed, so a hung example cannot leave processes behind.
:func:`run_scripts` runs independent scripts two at a time (one per core): a trainer's
run is mostly its interpreter importing torch on one core, while the test process waits.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(args: list[str], timeout: float, prefix: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess:
    """``python *args`` from the checkout's root, importing this checkout's shmload, with
    ``env`` added to the environment (a value of None removes the variable); ``prefix``
    runs it through another command first (:func:`small_shm`)."""
    return _finish(_start(args, prefix, env), args, timeout)


# At most this many scripts at once in run_scripts: the machine has 2 cores, and a script
# that imports torch and a trainer (most of its seconds) keeps one of them busy while the
# test process waits.
AT_ONCE = 2


def run_scripts(scripts: list[tuple[list[str], dict[str, str]]], timeout: float,
                at_once: int = AT_ONCE) -> list[subprocess.CompletedProcess]:
    """:func:`run_script` for each of ``scripts`` (``(args, env)`` pairs), ``at_once`` at a
    time, each in its own session with its own ``timeout``; their results, in order. They
    must not depend on each other. If one fails (its time-out) or the test is interrupted,
    every session started is killed before the error goes on, and no other script starts."""
    started: list[subprocess.Popen] = []
    lock = threading.Lock()
    stopping = threading.Event()

    def one(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
        with lock:
            if stopping.is_set():
                raise RuntimeError("not started: another script of the batch failed")
            proc = _start(args, (), env)
            started.append(proc)
        return _finish(proc, args, timeout)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=at_once)
    try:
        futures = [pool.submit(one, args, env) for args, env in scripts]
        return [future.result() for future in futures]
    except BaseException:  # a time-out, pytest-timeout's, Ctrl-C: nothing may outlive the test
        with lock:
            stopping.set()
            for proc in started:
                kill_session(proc.pid)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # (every session is done or killed by now)


def _start(args: list[str], prefix: tuple[str, ...], env: dict[str, str]) -> subprocess.Popen:
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    for key, value in env.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    proc = subprocess.Popen([*prefix, sys.executable, *args], cwd=ROOT, env=environ, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    proc.started = time.monotonic()
    return proc


def _finish(proc: subprocess.Popen, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as exc:  # its time-out, pytest-timeout's, Ctrl-C: nothing may outlive the test
        kill_session(proc.pid)
        out, err = proc.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            pytest.fail(f"{args} ran for more than {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
        raise
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    result.session = proc.pid  # the session's id (its leader's pid), to look for what it left
    result.seconds = time.monotonic() - proc.started  # (start to exit)
    return result


def session_processes(sid: int) -> list[psutil.Process]:
    """Live processes of session ``sid`` (a script's: torchrun, its ranks, their workers)."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (OSError, psutil.Error):
            continue
    return found


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (a script's: no other process is in it)."""
    try:
        os.killpg(sid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in session_processes(sid):  # (any rank or worker in a process group of its own)
        try:
            p.kill()
        except (OSError, psutil.Error):
            pass


def fail_if_left_behind(result: subprocess.CompletedProcess, what: str, why: str = "") -> None:
    """Fail (after killing them) if processes of the script's session outlive it by 5 s."""
    deadline = time.monotonic() + 5
    while (left := session_processes(result.session)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        names = [(p.pid, " ".join(p.cmdline())) for p in left]
        kill_session(result.session)
        pytest.fail(f"{what} exited but left processes behind: {names}\n{why or describe(result)}")


def can_unshare() -> bool:
    """Can this process give a script a private /dev/shm (:func:`small_shm`)? Root and
    ``unshare`` are needed."""
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10)
    return probe.returncode == 0


def small_shm(size: str) -> tuple[str, ...]:
    """A :func:`run_script` prefix: the script runs in a mount namespace of its own, on a
    fresh /dev/shm of ``size`` (tmpfs's size=, e.g. "16m"), which goes with it."""
    return ("unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"', "sh")


class MemoryCgroup:
    """A memory cgroup of its own with a limit, for a script (as root, where this machine's
    cgroups can be written): ``with MemoryCgroup("300M") as cg: run_script(..., prefix=cg.prefix)``.
    The cgroup is made under this process's own (v1 memory controller or v2) and removed
    after; :meth:`available` says whether one can be made here."""

    def __init__(self, limit: str):
        self.limit = limit
        self.path: str | None = None

    @staticmethod
    def _parent() -> tuple[str, str] | None:
        """(this process's memory cgroup directory, the limit file's name) if writable."""
        from shmload._transport import limits

        for version, mount, root in limits._memory_mounts("/proc/self/mountinfo"):
            rel = limits._cgroup_path("/proc/self/cgroup", version)
            if rel is None:
                continue
            here = os.path.normpath(os.path.join(mount, os.path.relpath(rel, root)))
            limit_file = limits._FILES[version][0]
            if version == 2 and "memory" not in open(os.path.join(here, "cgroup.subtree_control")).read():
                continue
            if os.geteuid() == 0 and os.access(here, os.W_OK):
                return here, limit_file
        return None

    @classmethod
    def available(cls) -> bool:
        try:
            return cls._parent() is not None
        except OSError:
            return False

    def __enter__(self) -> "MemoryCgroup":
        here, limit_file = self._parent()
        self.path = os.path.join(here, f"shmload-test-{os.getpid()}")
        os.mkdir(self.path)
        with open(os.path.join(self.path, limit_file), "w") as f:
            f.write(self.limit)
        return self

    @property
    def prefix(self) -> tuple[str, ...]:
        """A :func:`run_script` prefix: the script runs in this cgroup."""
        return ("sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh")

    def __exit__(self, *exc) -> None:
        import time

        deadline = time.monotonic() + 10
        while True:  # (its processes may take a moment to be gone from it)
            try:
                os.rmdir(self.path)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def describe(result: subprocess.CompletedProcess) -> str:
    return f"exit status {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def torchrun_args(ranks: int, args: list[str]) -> list[str]:
    """``python -m torch.distributed.run`` arguments for ``ranks`` processes on this machine
    (``--standalone``: a rendezvous on localhost, on a free port torchrun picks)."""
    return ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *args]


def read_jsonl(path) -> list:
    """The records an example appended, one JSON value a line (its ``--record`` files)."""
    with open(path) as f:
        return [json.loads(line) for line in f]
