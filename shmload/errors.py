"""The exceptions shmload raises.

Everything shmload raises of its own derives from :class:`ShmloadError`, so
``except shmload.ShmloadError`` catches all of it. Where code written for
``torch.utils.data.DataLoader`` expects a builtin type, the shmload class also
derives from that builtin: torch raises ``RuntimeError`` for worker failures and
time-outs, so :class:`WorkerError` and :class:`LoaderTimeoutError` are
``RuntimeError`` too.

Each message says whose fault it was and what to do about it.
"""

from __future__ import annotations

import pickle
from typing import NamedTuple


def format_bytes(n: float) -> str:
    """``n`` bytes for a message: 512 B, 32.0 KiB, 9.19 MiB, 1.50 GiB."""
    for unit, scale, digits in (("GiB", 2**30, 2), ("MiB", 2**20, 2), ("KiB", 2**10, 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{int(n)} B"


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


class SharedMemoryError(ShmloadError, MemoryError):
    """Shared memory could not be created or reserved (for example /dev/shm is too small)."""


class RingFullError(ShmloadError):
    """The consumer holds more batches than the ring's memory bound allows."""


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


class RemoteError(NamedTuple):
    """An exception raised in a worker, in a form that always crosses the process boundary.

    The exception object itself may not pickle (or unpickle), so only its type is sent
    by reference, with the message and the formatted traceback as text.
    """

    type_name: str
    type_pickle: bytes | None
    message: str
    traceback: str

    @classmethod
    def capture(cls, exc: BaseException, traceback_text: str) -> RemoteError:
        try:
            type_pickle = pickle.dumps(type(exc))
        except Exception:  # a local class, for example: rebuilt as WorkerError below
            type_pickle = None
        return cls(type(exc).__qualname__, type_pickle, str(exc), traceback_text)

    def rebuild(self, where: str) -> BaseException:
        """The exception to raise in the main process.

        Same type as in the worker where its constructor takes one message argument;
        otherwise a :class:`WorkerError` naming the original type. ``where`` says which
        worker and which batch, and the worker's full traceback follows.
        """
        text = f"Caught {self.type_name} {where}.\nOriginal {self.traceback}"
        exc_type = None
        if self.type_pickle is not None:
            try:
                exc_type = pickle.loads(self.type_pickle)
            except Exception:
                exc_type = None
        if exc_type is KeyError:
            # KeyError's str() is the repr of its argument, which would print the
            # traceback as one long line of escaped newlines.
            exc_type = _KeyErrorWithMessage
        if isinstance(exc_type, type) and issubclass(exc_type, StopIteration):
            exc_type = None  # raised from next(), it would silently end the caller's for-loop
        if isinstance(exc_type, type) and issubclass(exc_type, BaseException):
            try:
                return exc_type(text)
            except Exception:
                pass
        return WorkerError(text)


class _KeyErrorWithMessage(KeyError):
    """A KeyError whose str() is its message as written, so tracebacks stay readable."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    __qualname__ = "KeyError"


class ShmloadWarning(UserWarning):
    """Something went wrong and shmload recovered (for example it restarted a dead worker)."""


class OptionalDependencyError(ShmloadError, ImportError):
    """A feature needs an optional package that is not installed."""


class CommandError(ShmloadError):
    """The ``shmload`` command was given something it cannot use (a missing folder, a
    ``MODULE:FACTORY`` that does not import), or the user's own code it runs raised. The
    message is one line naming what failed and what to do; the command exits with status 2
    (see NOTE [ Command errors ] in ``cli.py``)."""
