"""Plot: a profile as a picture (worker utilization over time, stage breakdown).

matplotlib is an optional extra (``pip install 'shmload[plot]'``); without it,
:func:`plot_stats` raises :class:`~shmload.OptionalDependencyError` naming the extra.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import OptionalDependencyError
from . import counters

_E = {name: i for i, name in enumerate(counters.EVENT_FIELDS)}
STAGE_COLORS = {"fetch": "#4c72b0", "collate": "#55a868", "other": "#c44e52", "wait": "#dddddd"}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise OptionalDependencyError(
            "stats.plot() needs matplotlib, an optional extra: pip install 'shmload[plot]' "
            "(or use stats.trace('run.json') and open it in https://ui.perfetto.dev)") from exc
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def busy_share(starts: np.ndarray, ends: np.ndarray, origin: float, end: float,
               bins: int) -> tuple[np.ndarray, np.ndarray]:
    """The share of each of ``bins`` equal intervals of [origin, end] covered by the spans
    [starts[i], ends[i]] (which do not overlap), and the intervals' midpoints from origin."""
    edges = np.linspace(origin, end, bins + 1)
    covered = np.zeros(bins)
    for a, b in zip(starts, ends):
        covered += np.clip(np.minimum(edges[1:], b) - np.maximum(edges[:-1], a), 0.0, None)
    width = edges[1] - edges[0]
    return edges[:-1] + width / 2 - origin, (covered / width if width > 0 else covered)


def plot_stats(stats: Any, path: str, bins: int = 60) -> None:
    plt = _pyplot()
    tl = stats.timeline
    origin = tl["origin"]
    end = origin + stats.duration
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), gridspec_kw={"height_ratios": [3, 2]})
    for wid, events in sorted(tl["workers"].items()):
        # busy: from taking the task to reporting the batch
        x, util = busy_share(events[:, _E["started"]], events[:, _E["done"]], origin, end, bins)
        top.plot(x, 100 * util, label="in-process loading" if wid < 0 else f"worker {wid}")
    calls = tl["calls"]
    if len(calls):
        x, stall = busy_share(calls[:, 0], calls[:, 1], origin, end, bins)
        top.plot(x, 100 * stall, "k--", label="consumer waiting in next()")
    counts = tl.get("worker_counts") or []
    if counts:  # num_workers="auto": the count over time, on its own axis
        right = top.twinx()
        right.step([t - origin for t, _ in counts] + [stats.duration], [n for _, n in counts] + [counts[-1][1]],
                   where="post", color="#8172b2", label="workers run")
        right.set_ylim(0, max(n for _, n in counts) + 1)
        right.yaxis.get_major_locator().set_params(integer=True)  # (a count: whole ticks)
        right.set_ylabel("workers run (num_workers='auto')")
        right.legend(loc="lower right", fontsize="small")
    top.set_ylim(0, 105)
    top.set_xlabel("seconds")
    top.set_ylabel("% of the time")
    top.set_title(f"Busy workers and the data stall: {stats.batches_per_second:.1f} batches/s, "
                  f"stall {100 * stats.stall_fraction:.0f}%")
    top.legend(loc="best", fontsize="small")

    names = [("in-process" if w.id < 0 else f"worker {w.id}") for w in stats.workers]
    left = np.zeros(len(stats.workers))
    for stage in ("fetch", "collate", "other", "wait"):
        ms = np.array([1000 * getattr(w, stage) / w.batches if w.batches else 0.0 for w in stats.workers])
        bottom.barh(names, ms, left=left, color=STAGE_COLORS[stage],
                    label="waiting for a task" if stage == "wait" else stage)
        left += ms
    bottom.set_xlabel("ms per batch")
    bottom.set_title("Where a batch's time goes, per worker")
    bottom.legend(loc="lower right", fontsize="small", ncol=4)
    bottom.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
