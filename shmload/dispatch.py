"""Dispatch: which worker gets the next task (credit accounting, pure).

Each worker may hold at most ``per_worker`` tasks (torch's ``prefetch_factor``). The next
task goes to the live worker holding the fewest, so a slow worker is given less work
instead of stalling a fixed round-robin turn. The dispatcher also remembers every task
in flight, so a failure can name the indices a worker was holding.
"""

from __future__ import annotations

from typing import Any


class Dispatcher:
    def __init__(self, num_workers: int, per_worker: int):
        self.per_worker = per_worker
        self._tasks: list[dict[tuple[int, int], Any]] = [{} for _ in range(num_workers)]

    def pick(self) -> int | None:
        """The worker to send the next task to, or None if every worker is full."""
        best, best_load = None, self.per_worker
        for wid, tasks in enumerate(self._tasks):
            if len(tasks) < best_load:
                best, best_load = wid, len(tasks)
        return best

    def assign(self, wid: int, key: tuple[int, int], task: Any) -> None:
        self._tasks[wid][key] = task

    def complete(self, wid: int, key: tuple[int, int]) -> Any:
        return self._tasks[wid].pop(key)

    def task(self, wid: int, key: tuple[int, int]) -> Any:
        return self._tasks[wid][key]

    def held_by(self, wid: int) -> list:
        """The tasks worker ``wid`` holds, oldest first."""
        return list(self._tasks[wid].values())
