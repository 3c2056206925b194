"""Trace: a profile's timeline as Chrome trace events, for Perfetto or chrome://tracing.

The file is the JSON object format of the Trace Event Format: ``{"traceEvents": [...]}``.
Tracks:

* ``main (pid N)``: the consumer's thread, with a ``next()`` slice for each call (the
  time it waited for data, plus the loader's own work) and a ``step`` slice between
  calls (its own work), and a ``ring`` counter track: slots free / filling / ready /
  held by the consumer, sampled at most every 5 ms; with num_workers="auto", a
  ``workers run`` counter track: the count from each change on.
* ``worker i (pid N)``: one slice per stage of each batch: ``wait for task``, ``fetch``,
  ``collate``, ``other``. A worker measures each stage's duration exactly, but not where
  within the batch each piece happened (a row-wise batch interleaves fetching and
  writing sample by sample), so the slices are laid end to end in that order. A
  ``private memory (USS)`` counter track shows the worker's USS samples, in MB
  (``memory.py``: about one a second).

Times are microseconds from the start of the profile window. Only the last
``counters.EVENTS`` batches of each worker and ``profile.CALLS`` calls are kept.
"""

from __future__ import annotations

import json
from typing import Any

from . import counters

_E = {name: i for i, name in enumerate(counters.EVENT_FIELDS)}
_SYNTHETIC_PID = 1 << 22  # for a worker whose pid is unknown (it has exited)


def trace_events(stats: Any) -> list[dict[str, Any]]:
    tl = stats.timeline
    origin = tl["origin"]

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    main = tl["main_pid"]
    out: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": main, "args": {"name": f"main (pid {main})"}},
        {"name": "process_sort_index", "ph": "M", "pid": main, "args": {"sort_index": -1}},
        {"name": "thread_name", "ph": "M", "pid": main, "tid": main, "args": {"name": "consumer"}},
    ]
    for entered, left, nbytes, step in tl["calls"]:
        if step > 0:
            out.append({"name": "step", "cat": "consumer", "ph": "X", "pid": main, "tid": main,
                        "ts": us(entered - step), "dur": round(step * 1e6, 3)})
        out.append({"name": "next()", "cat": "stall", "ph": "X", "pid": main, "tid": main, "ts": us(entered),
                    "dur": round((left - entered) * 1e6, 3), "args": {"bytes": int(nbytes)}})
    for t, free, filling, ready, held in tl["occupancy"]:
        out.append({"name": "ring", "ph": "C", "pid": main, "ts": us(t),
                    "args": {"free": int(free), "filling": int(filling), "ready": int(ready), "held": int(held)}})
    for t, n in tl.get("worker_counts", ()):  # num_workers="auto"
        out.append({"name": "workers run", "ph": "C", "pid": main, "ts": us(max(t, origin)), "args": {"workers": n}})
    tracks: dict[int, tuple[int, int]] = {}  # worker id -> (pid, tid) of its track, once named
    for wid, events in sorted(tl["workers"].items()):
        pid, tid = _worker_track(tl, wid, out, tracks)
        for ev in events:
            seq = int(ev[_E["seq"]])
            start = ev[_E["started"]]
            pieces = [("wait for task", ev[_E["waited_from"]], start - ev[_E["waited_from"]]),
                      ("fetch", start, ev[_E["fetch"]]),
                      ("collate", start + ev[_E["fetch"]], ev[_E["collate"]])]
            after = start + ev[_E["fetch"]] + ev[_E["collate"]]
            pieces.append(("other", after, ev[_E["done"]] - after))
            for name, begin, duration in pieces:
                if duration > 0:
                    out.append({"name": name, "cat": "worker", "ph": "X", "pid": pid, "tid": tid, "ts": us(begin),
                                "dur": round(duration * 1e6, 3), "args": {"batch": seq}})
    for wid, rows in sorted(tl["memory"].items()):
        pid, _ = _worker_track(tl, wid, out, tracks)
        out.extend({"name": "private memory (USS)", "ph": "C", "pid": pid, "ts": us(t),
                    "args": {"MB": round(uss / 1e6, 1)}} for t, uss in rows)
    return out


def _worker_track(tl: dict[str, Any], wid: int, out: list[dict[str, Any]],
                  tracks: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """The (pid, tid) of worker ``wid``'s track; the first time, its names go to ``out``."""
    if wid in tracks:
        return tracks[wid]
    if wid < 0:  # num_workers=0: the main process loads in-line
        pid, tid, named = tl["main_pid"], tl["main_pid"] + 1, "in-process loading"
    else:
        known = tl["pids"].get(wid)
        pid = tid = known if known is not None else _SYNTHETIC_PID + wid
        named = f"worker {wid}" + (f" (pid {known})" if known is not None else "")
    if wid >= 0:
        out.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": named}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": wid}})
    out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                "args": {"name": "batches" if wid >= 0 else named}})
    tracks[wid] = pid, tid
    return pid, tid


def write_trace(stats: Any, path: str) -> None:
    with open(path, "w") as f:
        json.dump({"traceEvents": trace_events(stats), "displayTimeUnit": "ms",
                   "otherData": {"producer": "shmload", "batches": stats.main.batches}}, f)
