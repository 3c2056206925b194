"""Shipping the user's objects (dataset, collate_fn, worker_init_fn) to worker processes
under spawn and forkserver: pickled once per worker start, or once for all when that is
safe (see :class:`PerWorker`); an object that cannot be pickled is named before any
worker starts."""

from __future__ import annotations

import io
from multiprocessing import reduction
from typing import Any

from .._loading.worker import UserCode
from ..errors import WorkerStartupError


class _NotingPickler(reduction.ForkingPickler):
    """multiprocessing's pickler, noting whether a reducer registered with it ran
    (``ForkingPickler.register``: torch's tensors and storages, sockets, connections,
    shared ctypes). Those may hand over something only one process can take (a
    descriptor, a reference count); whatever else it pickles can be sent to any number."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.registered_reducer_ran = False
        for cls, reduce in self._extra_reducers.items():  # type: ignore[attr-defined]  # (not in typeshed)
            self.dispatch_table[cls] = self._noting(reduce)

    def _noting(self, reduce: Any) -> Any:
        def noted(obj: Any) -> Any:
            self.registered_reducer_ran = True
            return reduce(obj)
        return noted


def _pickled_user_code(user: UserCode, method: str) -> tuple[bytes, bool]:
    """The user's objects pickled, and whether these bytes may go to other workers too;
    any object that cannot be pickled is named."""
    try:
        buf = io.BytesIO()
        pickler = _NotingPickler(buf)
        pickler.dump(user)
        return buf.getvalue(), not pickler.registered_reducer_ran
    except Exception as exc:
        for field, value in zip(user._fields, user):
            try:
                reduction.ForkingPickler.dumps(value)
            except Exception as field_exc:
                raise WorkerStartupError(
                    f"the {field} ({type(value).__name__}) cannot be pickled, which the {method!r} start "
                    f"method needs to send it to the worker processes: {field_exc}. Make it picklable "
                    "(for example, open files lazily in __getitem__ instead of __init__), or use "
                    "multiprocessing_context='fork'."
                ) from field_exc
        raise WorkerStartupError(f"the loader's objects cannot be pickled for {method!r}: {exc}") from exc


class PerWorker:
    """The user's objects as sent to worker processes under spawn and forkserver: pickled
    while each worker's ``Process`` is being pickled (at each start and restart), the way
    torch's DataLoader sends its dataset; the worker receives plain ``bytes`` and unpickles
    them inside its own error handling (``worker.py``), so a failure there is still a
    ``WorkerStartupError`` with the worker's traceback, and an object that cannot be
    pickled is named before the first worker starts.

    Not one pickle for all workers: torch's tensor reductions hand each storage over as a
    descriptor that one process can take, once, so a second worker sent the same bytes
    failed at start-up with ``EOFError``. Pickled inside the ``Process``'s own pickling, a
    descriptor travels with that process's start (``duplicate_for_child``), not through a
    ``resource_sharer`` thread that keeps it until someone asks. When no such reducer ran
    (no tensors: numpy arrays, paths, ...) the first pickle is kept and sent to every
    worker, so a large dataset is not pickled once per worker."""

    __slots__ = ("user", "method", "reusable")

    def __init__(self, user: UserCode, method: str):
        self.user, self.method = user, method
        self.reusable: bytes | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        data = self.reusable
        if data is None:
            data, reusable = _pickled_user_code(self.user, self.method)
            if reusable:
                self.reusable = data
        return bytes, (data,)  # bytes(data) is data: no copy in the worker
