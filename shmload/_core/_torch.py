"""torch, if the user's program has imported it; shmload never imports it itself.

Why: torch is optional, takes a second or more to import, and brings threads (OpenMP,
its own) into every process that imports it, so a loader that imported torch to ask a
question (is this a tensor? is there a process group? which accelerator?) would slow and
change programs that never use it. A program that uses torch has imported it before it
makes tensors, process groups or seeds, so "not imported" answers each of those
questions: nothing of torch's to handle. The one exception, ``output="torch"``, imports
it on purpose (lifetime.py).
"""

from __future__ import annotations

import sys
from typing import Any


def loaded_torch() -> Any:
    """The ``torch`` module if it is imported already, else None (never imports it)."""
    return sys.modules.get("torch")
