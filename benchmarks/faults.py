"""Randomized faults, one per run, each run in a process of its own.

    python -m benchmarks.faults [--runs 200] [--seed 0] [--quick] [--run K] [--timeout S] [--out FILE]

Each run is a fresh ``python -c`` process (``child()`` below) that builds one loader
over a dataset whose sample i is i (so every batch names itself), drives one epoch
through one fault, and reports what it saw as one JSON line on stdout. The faults are
the ones tests/test_interrupts.py and tests/test_faults.py provoke one at a time, here with drawn
settings:

- ``none``: one epoch;
- ``early_break``: a ``break`` after k batches, then a fresh ``iter()`` gives the whole
  next epoch (the old iterator dropped or kept alive meanwhile);
- ``sigkill``: a worker SIGKILLed mid-epoch, by itself while loading a drawn index or
  from the main thread after k batches (only with restarts: a worker killed idle, when
  nothing was lost, need not be an error). With ``max_worker_restarts >= 1`` the epoch
  is exact; with 0 a ``WorkerDiedError`` is raised (counted as expected), the batches
  before it were right, and ``close()`` then finishes cleanly;
- ``ctrl_c``: SIGINT sent to the run's own process by a timer thread at random moments
  of the epoch, 1 to 6 times, the same iterator taken up again after each
  KeyboardInterrupt: every batch exactly once (the batch the for-loop bound before the
  interrupt is filed then, as the test does);
- ``ctrl_c_close``: SIGINT at a random moment of ``loader.close()``, then ``close()`` again;
- ``preempt``: as ``ctrl_c``, with what a cluster's preemption handler does instead: the
  run installs a SIGTERM handler that raises ``SystemExit``, and SIGTERM comes at random
  moments from ``iter()`` on (the workers' start-up included); each ``SystemExit`` is
  caught and the same iterator taken up again (a fresh ``iter()`` if it came before the
  first one returned): every batch exactly once;
- ``preempt_close``: that SIGTERM at a random moment of ``loader.close()``, then ``close()``
  again;
- ``threads``: 2 or 3 threads share one iterator: every batch once among them;
- ``fork``: ``os.fork()`` of the main process mid-epoch; the child runs
  multiprocessing's exit handler and ``os._exit(0)``, the parent goes on with the epoch.

With persistent workers a run that ended its epoch normally loads one more, which must
be whole. Drawn per run: the start method (fork, spawn, forkserver in 6:1:1, cycled with
the fault kind so that every pair comes up once in 72 runs), num_workers 1-3,
batch_size, dataset size, drop_last, shuffle, in_order, persistent_workers,
max_worker_restarts, prefetch_factor, a per-sample delay in the workers and the fault's
own moments. Run K of seed S is the same run whatever ``--runs`` is:
``python -m benchmarks.faults --seed S --run K`` runs it alone and shows its output.

What counts, per run:

- hang: the run did not finish within ``--timeout`` seconds. Its stacks are dumped
  (faulthandler, SIGUSR1) before its whole process group is killed;
- mismatch: the batches delivered differ from those of the same loader at
  ``num_workers=0`` (in_order: the same list; otherwise the same multiset; a cut epoch:
  a prefix, or a sub-multiset), or an expected ``WorkerDiedError`` did not come;
- error: an exception nobody provoked, or the run's process crashed;
- leak: after the run, in its process, a descriptor or a mapping of a shmload segment,
  or a live child process (multiprocessing's resource tracker and fork server excepted,
  not their children: fork-server workers are). Checked from outside: a
  ``/dev/shm/shmload-*`` entry that appeared during the run and remains after it (other
  programs may use /dev/shm, even shmload: only new names that stay count), or a process
  of the run's group that outlived it;
- zombie: a child process of the run's process in zombie state at its end.

Each check gives what is on its way out 3 s to go. Also counted, not failures: expected
errors (the ``WorkerDiedError`` above) and interrupts delivered (KeyboardInterrupts or
SystemExits caught in the epoch, or inside the first ``close()``). ``--quick`` (24 runs, for CI)
finishes in well under two minutes on two cores. Prints a table per fault kind and per
start method, the machine and the wall time; exits 1 if any run hung, leaked, left a
zombie, mismatched or failed. It asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import gc
import json
import math
import multiprocessing.util
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ("none", "early_break", "sigkill", "ctrl_c", "ctrl_c_close", "threads", "fork", "preempt", "preempt_close")
# Mostly fork, the default on Linux; a cycle of 8 against 9 fault kinds meets every pair.
METHODS = ("fork", "fork", "fork", "spawn", "fork", "fork", "fork", "forkserver")
SEGMENT = "/dev/shm/shmload-"  # shm.NAME_PREFIX: the library's only named objects
# CPython's long-lived helpers, started by spawn and forkserver, alive until the
# interpreter exits: recognized by the exact code they are started with.
HELPERS = ("from multiprocessing.resource_tracker import main", "from multiprocessing.forkserver import main")
GRACE = 3.0  # seconds that what is on its way out (a worker being reaped) gets to go
CHILD_CODE = "import sys; from benchmarks.faults import child; sys.exit(child(sys.argv[1]))"


# ---------------------------------------------------------------- drawing a run
def batch_count(n: int, batch_size: int, drop_last: bool) -> int:
    return n // batch_size if drop_last else math.ceil(n / batch_size)


def draw(seed: int, k: int) -> dict[str, Any]:
    """Run ``k`` of ``seed``: every setting and moment of its fault, from its own RNG."""
    rng = random.Random(f"{seed}:{k}")
    fault, method = FAULTS[(seed + k) % len(FAULTS)], METHODS[(seed + k) % len(METHODS)]
    batch_size = rng.randint(1, 8)
    if fault == "none":
        n = rng.randint(1, 160)
    elif fault in ("ctrl_c", "threads", "preempt"):  # long enough for interrupts and threads to interleave
        n = rng.randint(60, 400)
    else:
        n = rng.randint(2 * batch_size, 200)
    p = dict(run=k, seed=seed, fault=fault, method=method, n=n, batch_size=batch_size,
             num_workers=rng.randint(1, 3), drop_last=rng.random() < 0.2, shuffle=rng.random() < 0.3,
             in_order=rng.random() < 0.7, persistent_workers=rng.random() < 0.5,
             max_worker_restarts=rng.choice([0, 0, 0, 1, 2, 3]), prefetch_factor=rng.choice([None, None, 1, 2, 4]),
             delay=rng.choice([0.0, 0.0, 0.0002, 0.001]), loader_seed=rng.randrange(2**31))
    batches = batch_count(n, batch_size, p["drop_last"])
    cut = rng.randint(1, max(1, batches - 1))  # a moment inside the epoch, after its first batch
    if fault == "early_break":
        p.update(break_after=cut, keep_old=rng.random() < 0.5)
    elif fault == "sigkill":  # with and without restarts in turn, so that a short run has both
        p["max_worker_restarts"] = 0 if (seed + k) // len(FAULTS) % 2 else rng.randint(1, 3)
        outside = p["max_worker_restarts"] > 0 and rng.random() < 0.5
        p.update(kill="outside" if outside else "inside", kill_after=cut, die_at_position=rng.randrange(n))
    elif fault in ("ctrl_c", "preempt"):
        # log-uniform, 0.1 to 100 ms after the iterator is taken up: in the first next()
        # while workers start, in the bookkeeping of the following ones, and later on
        p.update(interrupts=[round(10 ** rng.uniform(-4, -1), 6) for _ in range(rng.randint(1, 6))],
                 step=rng.choice([0.0, 0.0002, 0.001]))
    elif fault in ("ctrl_c_close", "preempt_close"):
        # close() takes 3 to 60 ms here (fork, 1 worker; spawn, 3): 50 us to 30 ms, log-uniform
        p.update(close_after=rng.randint(0, batches), interrupt=round(10 ** rng.uniform(-4.3, -1.5), 6))
    elif fault == "threads":
        p.update(threads=rng.randint(2, 3))
    elif fault == "fork":
        p.update(fork_after=cut)
    return p


# ---------------------------------------------------------------- the run, in its own process
class Samples:
    """Sample i is i. In a worker: sleeps ``delay`` s per sample; notes its pid in
    ``scratch`` at its first sample (a worker that loads is past its start-up, so killing
    it is a death, not a failed start); the worker loading ``die_at`` SIGKILLs itself,
    once (a marker file remembers, so its replacement loads it)."""

    def __init__(self, n: int, delay: float = 0.0, die_at: int | None = None, scratch: str | None = None):
        self.n, self.delay, self.die_at, self.scratch = n, delay, die_at, scratch
        self.parent = os.getpid()
        self._noted: int | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        me = os.getpid()
        if self.scratch is not None and me != self.parent:
            if self._noted != me:
                self._noted = me
                Path(self.scratch, f"worker-{me}").touch()
            if i == self.die_at:
                try:
                    os.close(os.open(os.path.join(self.scratch, "died"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                    os.kill(me, signal.SIGKILL)
                except FileExistsError:
                    pass
        if self.delay:
            time.sleep(self.delay)
        return i


class Interrupt:
    """A real Ctrl-C (or ``signum``): the signal sent to this process from a timer thread
    after ``delay`` seconds (None: none). Python runs its handler in the main thread,
    wherever it is: KeyboardInterrupt, or the preemption handler's SystemExit."""

    def __init__(self, delay: float | None, signum: int = signal.SIGINT):
        self._timer = None if delay is None else threading.Timer(delay, os.kill, (os.getpid(), signum))

    def __enter__(self) -> Interrupt:
        if self._timer is not None:
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> bool:
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join(5)
        return False


def take(it: Any, limit: int | None = None) -> list[list[int]]:
    """Up to ``limit`` batches of ``it`` as lists (no view of a slot is kept)."""
    got: list[list[int]] = []
    while limit is None or len(got) < limit:
        try:
            batch = next(it)
        except StopIteration:
            break
        got.append(batch.tolist())
        del batch
    return got


class Run:
    """One run's loader, the epochs it must deliver, and what went wrong."""

    def __init__(self, p: dict[str, Any], scratch: str):
        import shmload
        self.p, self.scratch = p, scratch
        self.findings: dict[str, Any] = {"mismatches": [], "interrupts": 0, "expected_error": None, "epochs": 0}
        common = dict(batch_size=p["batch_size"], shuffle=p["shuffle"], drop_last=p["drop_last"], seed=p["loader_seed"])
        self.reference = shmload.DataLoader(Samples(p["n"]), **common)
        die_at = None
        if p["fault"] == "sigkill" and p["kill"] == "inside":
            flat = [i for batch in self.expected(0) for i in batch]
            die_at = flat[p["die_at_position"] % len(flat)] if flat else None
        self.dataset = Samples(p["n"], p["delay"], die_at, scratch)
        self.loader = shmload.DataLoader(
            self.dataset, num_workers=p["num_workers"], multiprocessing_context=p["method"],
            prefetch_factor=p["prefetch_factor"], persistent_workers=p["persistent_workers"],
            in_order=p["in_order"], max_worker_restarts=p["max_worker_restarts"], **common)

    def expected(self, epoch: int) -> list[list[int]]:
        self.reference.set_epoch(epoch)
        return take(iter(self.reference))

    def epoch(self, epoch: int) -> Any:
        """A fresh iterator for epoch ``epoch``."""
        self.loader.set_epoch(epoch)
        self.findings["epochs"] += 1
        return iter(self.loader)

    def compare(self, got: list[list[int]], epoch: int, whole: bool = True, ordered: bool | None = None) -> bool:
        want = self.expected(epoch)
        ordered = self.p["in_order"] if ordered is None else ordered
        if ordered:
            ok = got == want if whole else got == want[:len(got)]
        else:
            have, need = collections.Counter(map(tuple, got)), collections.Counter(map(tuple, want))
            ok = have == need if whole else not (have - need)
        if not ok:
            extra = collections.Counter(map(tuple, got)) - collections.Counter(map(tuple, want))
            missing = collections.Counter(map(tuple, want)) - collections.Counter(map(tuple, got))
            self.findings["mismatches"].append(
                f"epoch {epoch} ({'whole' if whole else 'cut'}, {'ordered' if ordered else 'any order'}): "
                f"{len(got)} batches for {len(want)} expected; extra {sorted(extra)[:4]}, "
                f"missing {sorted(missing)[:4] if whole else '-'}; first got {got[:3]}, want {want[:3]}")
        return ok

    def another_epoch(self, epoch: int) -> None:
        """With persistent workers, the epoch after a fault must be whole."""
        if self.p["persistent_workers"]:
            self.compare(take(self.epoch(epoch)), epoch)


def fault_none(run: Run) -> None:
    run.compare(take(run.epoch(0)), 0)
    run.another_epoch(1)


def fault_early_break(run: Run) -> None:
    old = run.epoch(0)
    run.compare(take(old, run.p["break_after"]), 0, whole=False)
    if not run.p["keep_old"]:
        del old
    run.compare(take(run.epoch(1)), 1)


def fault_sigkill(run: Run) -> None:
    from shmload import WorkerDiedError
    p, it, got = run.p, run.epoch(0), []
    try:
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            got.append(batch.tolist())
            del batch
            if p["kill"] == "outside" and len(got) == p["kill_after"]:
                run.findings["killed"] = kill_a_worker(run.scratch)
    except WorkerDiedError as exc:
        if p["max_worker_restarts"]:
            raise  # an error nobody expected: restarts were allowed
        run.findings["expected_error"] = f"WorkerDiedError: {str(exc)[:200]}"
        run.compare(got, 0, whole=False)
        run.loader.close()  # must finish cleanly after the death
        return
    if p["kill"] == "inside":
        run.findings["killed"] = "itself" if os.path.exists(os.path.join(run.scratch, "died")) else None
    if p["max_worker_restarts"] == 0:
        run.findings["mismatches"].append("a worker was SIGKILLed without restarts allowed, and no WorkerDiedError")
    run.compare(got, 0)
    run.another_epoch(1)


def kill_a_worker(scratch: str) -> int | None:
    """SIGKILL one live worker among those that have loaded samples: its pid, or None."""
    for name in sorted(os.listdir(scratch)):
        if name.startswith("worker-"):
            pid = int(name.split("-")[1])
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    os.kill(pid, signal.SIGKILL)
                    return pid
            except (psutil.NoSuchProcess, ProcessLookupError):
                continue
    return None


def _preempted(signum: int, frame: Any) -> None:
    """A cluster job's preemption handler: SIGTERM ends the program by SystemExit."""
    raise SystemExit(128 + signum)


def fault_ctrl_c(run: Run, signum: int = signal.SIGINT, raised: type = KeyboardInterrupt) -> None:
    """tests/test_interrupts.py's test_ctrl_c_inside_next_then_going_on_..., with
    drawn moments; for ``preempt``, from iter() on (tests/test_interrupts.py)."""
    pending, got, batch = list(run.p["interrupts"]), [], None
    it = run.epoch(0) if signum == signal.SIGINT else None
    while True:
        try:
            with Interrupt(pending.pop(0) if pending else None, signum):
                if it is None:
                    it = run.epoch(0)
                for batch in it:
                    got.append(batch.tolist())
                    if run.p["step"]:
                        time.sleep(run.p["step"])
            break
        except raised:
            run.findings["interrupts"] += 1
            # the for-loop bound `batch` before the interrupt could land in its body: file it once
            if batch is not None and (not got or got[-1] != batch.tolist()):
                got.append(batch.tolist())
    del batch
    run.compare(got, 0)
    run.another_epoch(1)


def fault_ctrl_c_close(run: Run, signum: int = signal.SIGINT, raised: type = KeyboardInterrupt) -> None:
    it = run.epoch(0)
    run.compare(take(it, run.p["close_after"]), 0, whole=False)
    closed = None
    started = time.monotonic()
    try:
        with Interrupt(run.p["interrupt"], signum):
            run.loader.close()
            closed = time.monotonic() - started
            time.sleep(0.01)  # the timer fires here when close() was quicker
    except raised:
        if closed is None:  # (one that lands in the sleep is no interrupt during close())
            run.findings["interrupts"] += 1
    run.findings["first_close_seconds"] = closed
    run.loader.close()


def fault_preempt(run: Run) -> None:
    signal.signal(signal.SIGTERM, _preempted)
    fault_ctrl_c(run, signal.SIGTERM, SystemExit)


def fault_preempt_close(run: Run) -> None:
    signal.signal(signal.SIGTERM, _preempted)
    fault_ctrl_c_close(run, signal.SIGTERM, SystemExit)


def fault_threads(run: Run) -> None:
    got: list[list[int]] = []
    errors: list[str] = []

    def share(it: Any) -> None:
        try:
            for batch in it:
                got.append(batch.tolist())
                del batch
        except BaseException as exc:  # a thread's exception would otherwise be lost
            errors.append("".join(traceback.format_exception_only(exc)).strip())
    it = run.epoch(0)
    threads = [threading.Thread(target=share, args=(it,)) for _ in range(run.p["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # (a stuck thread is a hang: the run's time-out catches it)
    if errors:
        raise RuntimeError(f"in a thread sharing the iterator: {errors}")
    run.compare(got, 0, ordered=False)  # which thread files a batch first is a race
    run.another_epoch(1)


def fault_fork(run: Run) -> None:
    """tests/test_interrupts.py's test_a_forked_child_that_exits_leaves_the_parents_
    workers_alone, at a drawn batch."""
    it = run.epoch(0)
    got = take(it, run.p["fork_after"])
    pid = os.fork()
    if pid == 0:  # the child ends as a script ends: multiprocessing's exit handler runs
        try:
            multiprocessing.util._exit_function()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the forked child exited with {os.waitstatus_to_exitcode(status)}")
    run.compare(got + take(it), 0)
    run.another_epoch(1)


FAULT_FUNCTIONS = {"none": fault_none, "early_break": fault_early_break, "sigkill": fault_sigkill,
                   "ctrl_c": fault_ctrl_c, "ctrl_c_close": fault_ctrl_c_close, "threads": fault_threads,
                   "fork": fault_fork, "preempt": fault_preempt, "preempt_close": fault_preempt_close}


def segments_held() -> list[str]:
    """This process's descriptors and mappings of shmload segments."""
    with open("/proc/self/maps") as maps:
        found = [f"mapped {line.split(maxsplit=5)[-1].strip()}" for line in maps if SEGMENT in line]
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(SEGMENT):
            found.append(f"fd {fd} -> {target}")
    return found


def descendants() -> tuple[list[str], list[str]]:
    """(live, zombie) descendants of this process, the helpers themselves excepted."""
    live, zombies = [], []
    for proc in psutil.Process().children(recursive=True):
        try:
            status = proc.status()
            cmd = " ".join(proc.cmdline()) if status != psutil.STATUS_ZOMBIE else ""
            parent = proc.ppid()
        except psutil.Error:
            continue
        if parent == os.getpid() and any(h in cmd for h in HELPERS):
            continue
        (zombies if status == psutil.STATUS_ZOMBIE else live).append(f"pid {proc.pid} (parent {parent}) {cmd[:80]}")
    return live, zombies


def leftovers() -> dict[str, list[str]]:
    """What the run left in this process, once what is on its way out had GRACE s to go."""
    deadline = time.monotonic() + GRACE
    while True:
        gc.collect()
        live, zombies = descendants()
        found = {"segments": segments_held(), "children": live, "zombies": zombies}
        if not any(found.values()) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def child(params: str) -> int:
    """The run's process: one loader through one fault, findings as one JSON line on stdout."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks for stacks before it kills a hang
    warnings.simplefilter("ignore")  # restart warnings and torch's more-workers-than-cores are expected
    p = json.loads(params)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="faults-") as scratch:
        run = None
        findings: dict[str, Any] = {"mismatches": []}
        try:
            run = Run(p, scratch)
            findings = run.findings
            FAULT_FUNCTIONS[p["fault"]](run)
        except BaseException as exc:  # (KeyboardInterrupt included: one that escapes is a finding)
            findings["error"] = "".join(traceback.format_exception(exc)[-6:]).strip()[-1500:]
        finally:
            if run is not None:
                run.loader.close()
            del run
    findings.update(leftovers(), seconds=round(time.monotonic() - started, 3))
    print(json.dumps(findings), flush=True)
    return 0


# ---------------------------------------------------------------- the parent
def shm_names() -> set[str]:
    prefix = os.path.basename(SEGMENT)
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}
    except FileNotFoundError:
        return set()


def group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                members.append(pid)
        except (OSError, psutil.Error):
            continue
    return members


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_for(condition: Any, seconds: float = GRACE) -> Any:
    """``condition()`` until it is falsy or ``seconds`` have passed: its last value."""
    deadline = time.monotonic() + seconds
    while (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def run_one(p: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run ``p`` in a new session (its own process group, killed whole on a hang)."""
    before = shm_names()
    proc = subprocess.Popen([sys.executable, "-c", CHILD_CODE, json.dumps(p)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    record: dict[str, Any] = {"params": p, "hang": False, "outlived": []}
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if proc.poll() is None:  # the run itself is stuck: its stacks, then the whole group
            record["hang"] = True
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(1.0)
        else:  # it finished, but something of its group still holds its output open
            record["outlived"] = [f"pid {pid}" for pid in group(proc.pid)]
        kill_group(proc.pid)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a process outside the group holds the pipes
            out, err = "", "(no output: the pipes stayed open after the group was killed)"
    finally:
        if proc.poll() is None:
            kill_group(proc.pid)
            proc.wait()
    if not record["outlived"]:
        record["outlived"] = [f"pid {pid}" for pid in wait_for(lambda: group(proc.pid))]
    kill_group(proc.pid)
    record["new_entries"] = sorted(wait_for(lambda: shm_names() - before))
    record["returncode"], record["stderr"] = proc.returncode, err
    lines = [line for line in out.splitlines() if line.startswith("{")]
    record["child"] = json.loads(lines[-1]) if lines else None
    return record


COLUMNS = ("runs", "hangs", "leaks", "zombies", "mismatches", "errors", "expected errors", "interrupts delivered")
FAILURES = ("hangs", "leaks", "zombies", "mismatches", "errors")


def verdict(record: dict[str, Any]) -> dict[str, Any]:
    """A run's counts (each 0 or 1, interrupts delivered a number) and the reasons."""
    child = record["child"] or {}
    why = []
    if record["hang"]:
        why.append("hang: no end within the time-out (stacks in its stderr)")
    leaks = [*child.get("segments", []), *(f"child {c}" for c in child.get("children", [])),
             *(f"/dev/shm/{n} remains" for n in record["new_entries"]),
             *(f"{pid} of its group outlived it" for pid in record["outlived"])]
    if leaks:
        why.append(f"leak: {leaks}")
    if child.get("zombies"):
        why.append(f"zombie: {child['zombies']}")
    if child.get("mismatches"):
        why.append(f"mismatch: {child['mismatches']}")
    error = child.get("error")
    if error is None and not record["hang"] and (record["child"] is None or record["returncode"] != 0):
        error = f"the run's process exited with {record['returncode']} and no report"
    if error:
        why.append(f"error: {error}")
    counts = {"runs": 1, "hangs": int(record["hang"]), "leaks": int(bool(leaks)),
              "zombies": int(bool(child.get("zombies"))), "mismatches": int(bool(child.get("mismatches"))),
              "errors": int(bool(error)), "expected errors": int(bool(child.get("expected_error"))),
              "interrupts delivered": child.get("interrupts", 0)}
    return {"counts": counts, "why": why}


def table(rows: dict[str, collections.Counter], title: str) -> str:
    head = f"| {title} | " + " | ".join(COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for name, counts in rows.items():
        lines.append(f"| {name} | " + " | ".join(str(counts[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def describe(p: dict[str, Any]) -> str:
    shown = {k: v for k, v in p.items() if k not in ("run", "seed", "fault", "method")}
    return f"{p['fault']} under {p['method']}: " + ", ".join(f"{k}={v}" for k, v in shown.items())


def report_failure(record: dict[str, Any], why: list[str]) -> None:
    p = record["params"]
    print(f"\nRUN {p['run']} FAILED ({describe(p)})", file=sys.stderr)
    for reason in why:
        print(f"  {reason}", file=sys.stderr)
    print(f"  again: python -m benchmarks.faults --seed {p['seed']} --run {p['run']}", file=sys.stderr)
    tail = record["stderr"].strip().splitlines()
    if tail:
        print("  its stderr (end):\n    " + "\n    ".join(tail[-60:]), file=sys.stderr)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="24 runs, for CI")
    ap.add_argument("--run", type=int, default=None, help="only run K of --seed, with its output")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a run counts as a hang")
    ap.add_argument("--out", type=Path, default=None, help="write every run's record here (JSON)")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs = 24
    return args


def main(argv: list[str] | None = None) -> int:
    from .host import cpu_model
    args = parse_args(argv)
    indices = [args.run] if args.run is not None else range(args.runs)
    by_fault = {f: collections.Counter() for f in FAULTS}
    by_method = {m: collections.Counter() for m in dict.fromkeys(METHODS)}
    total: collections.Counter = collections.Counter()
    records = []
    started = time.monotonic()
    for k in indices:
        p = draw(args.seed, k)
        if args.run is not None:
            print(json.dumps(p), file=sys.stderr)
        record = run_one(p, args.timeout)
        judged = verdict(record)
        record.update(judged)
        records.append(record)
        for counter in (by_fault[p["fault"]], by_method[p["method"]], total):
            counter.update(judged["counts"])
        failed = any(judged["counts"][c] for c in FAILURES)
        if failed:
            report_failure(record, judged["why"])
        if args.run is not None:
            print(record["stderr"], file=sys.stderr, end="")
            print(json.dumps(record["child"]), file=sys.stderr)
        sys.stderr.write("x" if failed else ".")
        sys.stderr.flush()
    wall = time.monotonic() - started
    print(file=sys.stderr)
    print(table({**{f: c for f, c in by_fault.items() if c["runs"]}, "all": total}, "fault"))
    print()
    print(table({**{m: c for m, c in by_method.items() if c["runs"]}, "all": total}, "start method"))
    print(f"\nseed {args.seed}, {total['runs']} runs, wall time {wall:.1f} s; {cpu_model()}, "
          f"{os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), python {sys.version.split()[0]}")
    if args.out:
        args.out.write_text(json.dumps(records, indent=1))
    return 1 if any(total[c] for c in FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())
