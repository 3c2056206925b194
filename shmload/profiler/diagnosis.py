"""The diagnosis of a profile (pure): is training waiting for data, which stage costs
what, how many workers, and does a worker's memory grow. The questions and the figures
they rest on are described in ``stats.py``; this module turns a
:class:`~shmload.profiler.stats.LoaderStats` into the few sentences
``print(loader.stats())`` ends with."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core._units import decimal_rate, decimal_size
from .dataset import DatasetInfo

if TYPE_CHECKING:
    from .stats import LoaderStats

BUSY_WORKERS = 0.80  # workers busy this share of their time or more: they are the limit

_STAGE_ADVICE = {
    "collate": "collate and the copy into the slot (return fixed-shape, contiguous numpy arrays; avoid a "
               "collate_fn that builds Python objects or copies twice)",
    "other": "the loader's own per-batch work (seeding, waiting for a larger ring slot, reporting): pass "
             "slot_bytes so the ring is sized once, or use larger batches",
}


def stage_advice(stage: str, dataset: DatasetInfo | None) -> str:
    """What to speed up in ``stage``, naming only what the dataset is known to do."""
    if stage != "fetch":
        return _STAGE_ADVICE[stage]
    d = dataset or DatasetInfo("")
    if d.images and d.reduced_decode:
        how = ("image decoding, which shmload.transforms already do at reduced size: store smaller source "
               "images, or pass fast_decode=True (libjpeg's fast DCT)")
    elif d.images and d.reduced_decode is False:
        how = ("image decoding at full size, as the transform was told (reduced_decode=False): let it decode "
               "JPEGs at 1/2, 1/4 or 1/8 size when the output allows (reduced_decode=True, the default), or use "
               "smaller source images")
    elif d.images:
        how = ("image decoding at full size: decode with shmload.transforms (train_pipeline, RandomResizedCrop, "
               "Resize), which decode JPEGs at 1/2, 1/4 or 1/8 size when the output allows; or use smaller "
               "source images")
    else:
        how = "do less work per sample; cache what it reads or computes"
    if not d.batched and not d.stream:
        how += "; serve whole batches with __getitems__"
    method = "__iter__" if d.stream else "__getitem__"
    owner = f"{d.name}." if d.name else "the dataset's "
    return f"{owner}{method} ({how})"


def _figures(s: LoaderStats) -> tuple[float, float, float, int | None]:
    """What the advice quotes: a batch's ms for a worker and for the consumer (0 if unknown),
    the workers' busy share of their time, and the workers that would keep up."""
    util = sum(w.busy for w in s.workers) / max(1e-12, sum(w.busy + w.wait for w in s.workers))
    return 1000 * (s.worker_cost() or 0.0), 1000 * (s.step_cost() or 0.0), util, s.workers_needed()


def _load_in_workers(s: LoaderStats, top: str) -> list[str]:
    """Data-bound, loading in the main process: the workers that would keep up."""
    worker_ms, step_ms, _, needed = _figures(s)
    parts = [f"Recommendation: load in worker processes: num_workers={min(needed or 1, s.cores)}. A batch costs "
             f"{worker_ms:.2f} ms to load and the step {step_ms:.2f} ms, so keeping up takes about "
             f"{needed} workers; {s.cores} cores are usable."]
    if needed is not None and needed > s.cores:
        parts.append(f"That is fewer than needed: also speed up {stage_advice(top, s.dataset)}.")
    return parts


def _auto_busy(s: LoaderStats, top: str) -> list[str]:
    """Data-bound with num_workers="auto", the workers busy: the count is the loader's."""
    _, _, util, needed = _figures(s)
    cap = s.max_workers or s.num_workers
    if s.num_workers < cap:
        why = (f"it runs {s.num_workers} of at most {cap}: it adds workers only while a core is free and an "
               "addition raises the rate, so the cores (or other programs) are the limit")
    else:
        why = f"it runs its cap of {cap} (max_workers, by default the usable cores)" + (
            f"; about {needed} would keep up and {s.cores} cores are usable: raise max_workers"
            if needed and needed > cap and cap < s.cores else "")
    return [f"Recommendation: speed up {stage_advice(top, s.dataset)}. The workers are busy {100 * util:.0f}% "
            f"of the time, and num_workers='auto' chose its count: {why}."]


def _busy_workers(s: LoaderStats, top: str) -> list[str]:
    """Data-bound, the workers busy: more of them if that helps and fits, else a faster stage."""
    if s.worker_counts is not None:
        return _auto_busy(s, top)
    worker_ms, step_ms, util, needed = _figures(s)
    room = s.cores - s.num_workers
    if needed is not None and needed > s.num_workers and room > 0:
        parts = [f"Recommendation: num_workers={min(needed, s.cores)}. The workers are busy {100 * util:.0f}% of the "
                 f"time; a batch costs a worker {worker_ms:.2f} ms and the consumer {step_ms:.2f} ms, so "
                 f"keeping up takes about {needed} workers, and {s.cores} cores are usable."]
        if needed > s.cores:
            parts.append(f"That is fewer than the {needed} needed: also speed up {stage_advice(top, s.dataset)}.")
        return parts
    why = (f"{s.num_workers} workers already use the {s.cores} usable cores" if room <= 0 else
           f"more workers would not help much (about {needed} needed)")
    return [f"Recommendation: speed up {stage_advice(top, s.dataset)}. The workers are busy "
            f"{100 * util:.0f}% of the time and {why}."]


def _data_bound(s: LoaderStats, stage_line: str, top: str) -> list[str]:
    """The finding when the consumer waits for data, and what to change."""
    _, step_ms, util, _ = _figures(s)
    parts = [f"diagnosis: DATA-BOUND. The consumer waits for data {100 * s.stall_fraction:.0f}% of its time "
             f"({1000 * s.main.stall / s.main.batches:.2f} ms a batch inside next(), against {step_ms:.2f} ms of "
             "its own work).", stage_line]
    if s.num_workers == 0:
        return parts + _load_in_workers(s, top)
    if util >= BUSY_WORKERS:
        return parts + _busy_workers(s, top)
    return parts + [f"Recommendation: a deeper queue: prefetch_factor={2 * s.prefetch} (now {s.prefetch} tasks "
                    f"a worker). The workers are busy only {100 * util:.0f}% of the time while the consumer "
                    "waits, so batches are not handed out fast enough; if that does not help, the main "
                    "process itself is the limit (larger batches cost it less per sample)."]


def _consumer_bound(s: LoaderStats, stage_line: str) -> list[str]:
    """The finding when loading keeps up, and whether fewer workers would."""
    worker_ms, step_ms, _, needed = _figures(s)
    parts = [f"diagnosis: CONSUMER-BOUND. Loading is hidden behind the consumer's own work: it waits for "
             f"data only {100 * s.stall_fraction:.0f}% of its time.", stage_line]
    if s.num_workers != 0 and needed is not None and needed < s.num_workers and s.worker_counts is None:
        return parts + [f"Recommendation: num_workers={needed} would keep up and free {s.num_workers - needed} "
                        f"core(s): a batch costs a worker {worker_ms:.2f} ms and the consumer {step_ms:.2f} ms."]
    return parts + ["Recommendation: nothing to change in the loader; speed up the training step itself."]


def memory_growth(s: LoaderStats) -> str | None:
    """The workers whose private memory grew (NOTE [ When a worker's memory grows ],
    memory.py), their figures averaged, and the likely cause and its fix; None if none grew."""
    grown = [w.memory for w in s.workers if w.memory is not None and w.memory.growing]
    if not grown:
        return None
    n, of = len(grown), sum(w.memory is not None for w in s.workers)
    growth, seconds = decimal_size(sum(m.growth for m in grown) / n), sum(m.seconds for m in grown) / n
    if all(m.steady for m in grown):
        how = (f"grows steadily (+{growth} over {seconds:.0f} s per worker, "
               f"+{decimal_rate(sum(m.rate for m in grown) / n)}; {n} of {of} workers)")
    else:
        how = (f"grew and levelled off (+{growth} over {seconds:.0f} s per worker, to "
               f"{decimal_size(sum(m.last for m in grown) / n)}; {n} of {of} workers)")
    return (f"Memory: the workers' private memory {how}: likely copy-on-read. The dataset holds Python "
            "objects (a list of file names or dicts) whose reference counts, written when they are read, "
            "touch pages inherited from the main process, so each worker ends up with its own copy "
            "(PyTorch issue 13246). Hold them in numpy arrays or shmload.datasets.StringArray; if the "
            "dataset holds no such objects, look for a leak in what it keeps per sample.")


def diagnose(s: LoaderStats) -> str:
    if s.main.batches == 0:
        return "diagnosis: no batch delivered in this window yet."
    stages = s.stage_seconds()
    busy = sum(stages.values())
    if not s.workers or busy <= 0:
        return "diagnosis: no worker time recorded in this window yet."
    top = max(stages, key=stages.__getitem__)
    share = stages[top] / busy
    stage_line = (f"The workers spend {100 * share:.0f}% of their busy time in {top} "
                  f"({1000 * stages[top] / max(1, sum(w.batches for w in s.workers)):.2f} ms a batch).")
    parts = _data_bound(s, stage_line, top) if s.data_bound else _consumer_bound(s, stage_line)
    memory = memory_growth(s)
    if memory:
        parts.append(memory)
    contention = s.contention()
    if contention:
        parts.append(f"Caution: {contention} during this window, leaving this loader fewer than it could use: "
                     "the throughput and the recommendation may be too low; measure again on a quiet machine.")
    return "\n".join(parts)
