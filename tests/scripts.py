"""Running an example as a user would: ``python script ...`` in a session of its own.

Shared by the example tests. On a time-out the whole session (the script, its workers,
torchrun's ranks) is killed, so a hung example cannot leave processes behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(args: list[str], timeout: float, **env: str) -> subprocess.CompletedProcess:
    """``python *args`` from the checkout's root, importing this checkout's shmload, with
    ``env`` added to the environment (a value of None removes the variable)."""
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    for key, value in env.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=environ, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{args} ran for more than {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    result.session = proc.pid  # the session's id (its leader's pid), to look for what it left
    return result


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
