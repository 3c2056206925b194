"""Which path the per-sample work takes: the compiled core (``_native.c``, built by the
install where a C compiler is present: setup.py) or pure Python.

The two give bit-identical batches and the same errors: each compiled function either
does what the Python code it stands in for does, or declines, and the Python code runs
(NOTE at the top of _native.c). ``SHMLOAD_PURE_PYTHON=1`` forces pure Python, for a
comparison or a bug report; it is read once, when shmload is imported (workers started
with spawn or forkserver inherit the environment, so they follow it too).
"""

from __future__ import annotations

import os
from types import ModuleType

PURE_PYTHON_ENV = "SHMLOAD_PURE_PYTHON"


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None, f"pure Python ({PURE_PYTHON_ENV}={os.environ[PURE_PYTHON_ENV]})"
    try:
        from . import _native  # type: ignore[attr-defined]  # (built by setup.py; absent without a compiler)
    except ModuleNotFoundError as exc:
        return None, f"pure Python (the compiled core is not built: {exc})"
    except (ImportError, RuntimeError) as exc:  # built against a numpy this one cannot load, say
        return None, f"pure Python (the compiled core is built but cannot be loaded: {exc})"
    return _native, "compiled"


native, DESCRIPTION = _load()
CORE = "compiled" if native is not None else "python"  # what stats() and the profile report


def compiled_core() -> bool:
    """Whether the per-sample work of the default collate runs compiled (``_native.c``)
    in this process; False without a compiler at install time or with
    ``SHMLOAD_PURE_PYTHON=1``. Batches and errors are the same either way."""
    return native is not None
