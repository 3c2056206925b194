"""The exceptions shmload raises.

Everything shmload raises of its own derives from :class:`ShmloadError`, so
``except shmload.ShmloadError`` catches all of it. Where code written for
``torch.utils.data.DataLoader`` expects a builtin type, the shmload class also
derives from that builtin: torch raises ``RuntimeError`` for worker failures and
time-outs, so :class:`WorkerError` and :class:`LoaderTimeoutError` are
``RuntimeError`` too.

A shortage of shared memory is a :class:`SharedMemoryError` (a ``MemoryError``), whatever
its kind: /dev/shm too small to reserve a segment, or the ring at its bound
(:class:`RingFullError`).

Each message says whose fault it was and what to do about it.
"""

from __future__ import annotations

import functools
import pickle
import traceback
from typing import Any, NamedTuple


def format_indices(indices, limit: int = 16) -> str:
    """Dataset indices for a message, shortened: a batch may hold a million of them."""
    if isinstance(indices, int) or len(indices) <= limit:
        return str(list(indices) if not isinstance(indices, int) else indices)
    head = ", ".join(map(str, indices[:limit // 2]))
    tail = ", ".join(map(str, indices[-4:]))
    return f"[{head}, ..., {tail}] ({len(indices)} indices)"


def describe_load(what) -> str:
    """What a task loads, for a message: ``dataset indices [...]`` for a map-style batch,
    the stream's own description (``messages.Draw``) for an iterable source's."""
    describe = getattr(what, "describe", None)
    return describe() if describe is not None else f"dataset indices {format_indices(what)}"


class ShmloadError(Exception):
    """Base class of every error shmload raises of its own."""


class CollateError(ShmloadError, ValueError):
    """Samples of one batch cannot be batched together (structure, shape or dtype differ),
    or a sample holds something that cannot be placed in shared memory."""


class TensorTypeError(CollateError, TypeError):
    """``output="torch"`` and an array of a dtype torch has no tensor for (``datetime64``,
    ``timedelta64``, ``str_``, ...). A ``TypeError``, as ``torch.from_numpy``'s error (and so
    torch's DataLoader's) is, and a CollateError, as every batch that cannot be made is."""


class SharedMemoryError(ShmloadError, MemoryError):
    """Not enough shared memory: it could not be created or reserved (for example the
    container's memory limit, or /dev/shm with the POSIX backend, is too small), or the
    ring reached its bound (:class:`RingFullError`).
    ``except shmload.SharedMemoryError`` catches every shortage, whatever its kind."""


class RingFullError(SharedMemoryError):
    """The consumer holds more batches than the ring's memory bound allows, or a batch
    needs larger slots than fit under it. The bound is ``max_shm_bytes``, by default read
    from what limits memory here (limits.py; the message says which limit it was): a
    shortage of shared memory like any other, so a
    :class:`SharedMemoryError` (and, as before, a :class:`ShmloadError`)."""


class WorkerError(ShmloadError, RuntimeError):
    """A worker process failed; the message names the worker and what it was doing."""


class WorkerStartupError(WorkerError):
    """A worker failed before it could load anything (``worker_init_fn``, unpicklable dataset...)."""


class WorkerDiedError(WorkerError):
    """A worker process exited unexpectedly (killed, crashed, ``os._exit``)."""


class LoaderTimeoutError(ShmloadError, TimeoutError, RuntimeError):
    """No batch arrived within the loader's ``timeout``."""


class ImageDecodeError(ShmloadError, OSError):
    """An image file could not be opened or decoded; the message names the file and the
    dataset index (``shmload.datasets.ImageFolder``)."""


class PinningError(ShmloadError):
    """The accelerator refused to page-lock the loader's shared memory (pinning.py)."""


class RecordFormatError(ShmloadError, ValueError):
    """A records directory that is not one, is of another version, or does not hold
    together (an index of the wrong length, a part of the wrong size)."""


class RecordCorruptError(ShmloadError, OSError):
    """A sample's bytes do not match what the index recorded (a flipped bit, a part that
    was overwritten): the message names the part, the sample and the offset."""


class RemoteError(NamedTuple):
    """An exception raised in a worker, in a form that always crosses the process boundary.

    The exception object itself may not pickle (or unpickle), so only its type is sent
    by reference, with the message and the formatted traceback as text.

    NOTE [ Capturing a worker's exception ]. :meth:`capture` runs in the worker's error
    path, where nothing may raise: an exception escaping it kills the worker, and the
    user gets a ``WorkerDiedError`` (with advice about memory) and a dead iterator for
    what was a bug in an exception's ``__str__``. So each step that runs the exception's
    own code is guarded and falls back to what can still be said: ``str(exc)`` (a
    ``__str__`` may raise, or return a ``str`` subclass that does not pickle), its
    ``repr()``, formatting the traceback (a ``__notes__`` property may raise) and
    pickling the type (a local class cannot be). :meth:`rebuild` takes the same care in
    the main process, where the report must be what the rebuilt exception prints.
    """

    type_name: str
    type_pickle: bytes | None
    message: str
    traceback: str

    @classmethod
    def capture(cls, exc: BaseException, traceback_text: str | None = None) -> RemoteError:
        """``exc`` as plain text and a type reference. ``traceback_text`` (else formatted
        here, guarded) is the worker's traceback of it."""
        try:
            type_pickle = pickle.dumps(type(exc))
        except Exception:  # a local class, for example: rebuilt as WorkerError below
            type_pickle = None
        name = _plain(lambda: type(exc).__qualname__, "<an exception type without a name>")
        message = _message(exc)
        if traceback_text is None:
            traceback_text = _traceback_text(exc, name, message)
        return cls(name, type_pickle, message, _plain(lambda: traceback_text, "(no traceback)\n"))

    def rebuild(self, where: str) -> BaseException:
        """The exception to raise in the main process.

        Same type as in the worker where its constructor takes one message argument
        (a subclass of it that prints the report where the type itself would not, see
        :func:`_printing`); otherwise a :class:`WorkerError` naming the original type.
        ``where`` says which worker and which batch, and the worker's full traceback
        follows.
        """
        text = f"Caught {self.type_name} {where}.\nOriginal {self.traceback}"
        exc_type = None
        if self.type_pickle is not None:
            try:
                exc_type = pickle.loads(self.type_pickle)
            except Exception:
                exc_type = None
        if isinstance(exc_type, type) and issubclass(exc_type, StopIteration):
            exc_type = None  # raised from next(), it would silently end the caller's for-loop
        if isinstance(exc_type, type) and issubclass(exc_type, BaseException):
            try:
                exc = exc_type(text)
            except Exception:
                exc = None
            if isinstance(exc, BaseException):
                return _printing(exc, text)
        return WorkerError(text)


def _plain(make: Any, fallback: str) -> str:
    """``make()`` as a plain ``str`` (a subclass may not pickle), or ``fallback`` if it
    raises or is no str."""
    try:
        return str.__str__(make())
    except Exception:
        return fallback


def _failure(exc: BaseException) -> str:
    """``Type: message`` of an exception raised while describing another, never raising."""
    name = _plain(lambda: type(exc).__qualname__, "an exception")
    text = _plain(lambda: str(exc), "")
    return f"{name}: {text}" if text else name


def _message(exc: BaseException) -> str:
    """``str(exc)``; if that raises, says so as the traceback module does, with the repr."""
    try:
        return str.__str__(str(exc))
    except Exception as failure:
        why = _failure(failure)
    shown = _plain(lambda: f"its repr: {repr(exc)}", "repr() failed too")
    return f"<exception str() failed: {why}; {shown}>"


def _traceback_text(exc: BaseException, name: str, message: str) -> str:
    """The traceback as ``traceback.format_exc()`` would print it; if formatting raises,
    the frames alone with the captured name and message."""
    try:
        return "".join(traceback.format_exception(exc))
    except Exception as failure:
        frames = _plain(lambda: "".join(traceback.format_tb(exc.__traceback__)), "")
        return (f"Traceback (most recent call last):\n{frames}{name}: {message}\n"
                f"(the full traceback could not be formatted: {_failure(failure)})\n")


def _printing(exc: BaseException, text: str) -> BaseException:
    """``exc`` if its ``str()`` is ``text`` (the worker's report) and its ``repr()`` works;
    else the same built as a subclass of its type that prints ``text`` (a KeyError's
    ``str()`` is the repr of its argument, a user's ``__str__`` may raise or print
    something else): still caught by ``except ThatType``; a WorkerError if neither can."""
    if _prints(exc, text):
        return exc
    # (a class is hashable; mypy says type[BaseException] is not: python/typeshed#4638)
    printing = _printing_type(type(exc))  # type: ignore[arg-type]
    if printing is not None:
        try:
            rebuilt = printing(text)
        except Exception:
            rebuilt = None
        if rebuilt is not None and _prints(rebuilt, text):
            return rebuilt
    return WorkerError(text)


def _prints(exc: BaseException, text: str) -> bool:
    try:
        repr(exc)
        return str(exc) == text
    except Exception:
        return False


def _report(self: BaseException) -> str:
    return str(self.args[0]) if self.args else ""


@functools.lru_cache(maxsize=64)
def _printing_type(exc_type: type) -> type | None:
    """A subclass of ``exc_type`` whose ``str()`` is its message as written and whose
    ``repr()`` is BaseException's; named as ``exc_type``, so a traceback shows that name."""
    try:
        return type(exc_type.__name__, (exc_type,), {
            "__str__": _report, "__repr__": BaseException.__repr__, "__module__": exc_type.__module__,
            "__qualname__": exc_type.__qualname__, "__doc__": exc_type.__doc__})
    except Exception:  # a type that cannot be subclassed
        return None


class ShmloadWarning(UserWarning):
    """Something went wrong and shmload recovered (for example it restarted a dead worker)."""


class OptionalDependencyError(ShmloadError, ImportError):
    """A feature needs an optional package that is not installed."""


class CommandError(ShmloadError):
    """The ``shmload`` command was given something it cannot use (a missing folder, a
    ``MODULE:FACTORY`` that does not import), or the user's own code it runs raised. The
    message is one line naming what failed and what to do; the command exits with status 2
    (see NOTE [ Command errors ] in ``cli.py``)."""


# ---------------------------------------------------------------- a worker's death
def restart_message(h: Any, new_pid: int, used: int, allowed: int, seqs: list[int]) -> str:
    """The warning for dead worker ``h`` (a supervisor handle) replaced by ``new_pid``,
    which was sent the batches ``seqs`` again."""
    lost = ("no batch" if not seqs else f"batch {seqs[0]}" if len(seqs) == 1 else
            "batches " + ", ".join(map(str, seqs[:8])) + (f", ... ({len(seqs)} in all)" if len(seqs) > 8 else ""))
    return (f"DataLoader worker process {h.id} (pid {h.pid}) {h.exit_description()} unexpectedly; started "
            f"pid {new_pid} in its place (restart {used} of max_worker_restarts={allowed}) and sent it {lost} again.")


def death_error(h: Any, held: list[tuple[int, Any]], max_restarts: int) -> ShmloadError:
    """The error for dead worker ``h`` that is not replaced; ``held``: its (batch, load) pairs."""
    if not h.ready:
        return WorkerStartupError(
            f"DataLoader worker process {h.id} (pid {h.pid}) {h.exit_description()} during start-up, "
            "before it could report an error; see its output above (an import error under spawn "
            "or forkserver is a common cause)")
    doing = ("; it was loading " + ", ".join(f"batch {seq} ({describe_load(load)})" for seq, load in held)
             if held else "")
    if max_restarts:
        restarts = f" All {max_restarts} restarts allowed (max_worker_restarts) were used."
    else:
        restarts = " Pass max_worker_restarts=N to replace up to N dead workers instead of failing."
    return WorkerDiedError(
        f"DataLoader worker process {h.id} (pid {h.pid}) {h.exit_description()} unexpectedly{doing}. "
        f"If it was killed for memory (SIGKILL), lower num_workers, prefetch_factor or batch_size.{restarts}")


def starting_steps(method: str, worker_init_fn: Any) -> str:
    """What a worker that has not reported ready may still be doing."""
    steps = ["worker_init_fn"] if worker_init_fn is not None else []
    if method != "fork":
        steps.insert(0, "unpickling the dataset")
    steps.insert(0, f"its start ({method})")
    return " or ".join(steps)
