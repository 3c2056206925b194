"""Host-to-device copies from pinned batches: shmload's page-locked ring against torch's
pin-memory thread and against pageable memory.

    python -m benchmarks.pinned [--runs 5] [--batches 40] [--quick]

Needs CUDA: without it (``torch.cuda.is_available()`` false, or torch not installed) it
prints why and measures nothing (exit status 0, so CI can run it anywhere).

Three loaders over the ``transport`` images (3x224x224 uint8, batch 64, ~9.6 MB; and
3x512x512, batch 32, ~25 MB), 2 workers each, in one run, alternating:

* ``shmload pinned``: ``pin_memory=True, output="torch"``: the batch is a view of a ring
  slot that was page-locked once, when it was mapped (no copy per batch);
* ``torch pinned``: torch's DataLoader with ``pin_memory=True``: its pin-memory thread
  copies every batch into a fresh page-locked buffer;
* ``shmload pageable``: ``pin_memory=False``: the same slots, not page-locked.

For every batch the consumer does ``x.to("cuda", non_blocking=True)`` on a side stream
and waits for it; the figure is bytes copied / seconds inside those copies (GB/s, the
median of the runs), plus the loader's batches/s end to end. A non-blocking copy from
pageable memory is synchronous (staged through a driver buffer), which is what the
third row shows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import shmload

from .workloads import CachedImages

SHAPES = {"9.6 MB": ((3, 224, 224), 64), "25 MB": ((3, 512, 512), 32)}


def _cuda_or_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install -e '.[bench]')"
    if not torch.cuda.is_available():
        return "CUDA is not available on this machine (torch.cuda.is_available() is False)"
    return None


def _loader(kind: str, shape: tuple, batch: int, batches: int):
    import torch
    dataset = CachedImages(batch * batches, shape)
    if kind == "torch pinned":
        return torch.utils.data.DataLoader(dataset, batch_size=batch, num_workers=2, pin_memory=True)
    return shmload.DataLoader(dataset, batch_size=batch, num_workers=2, output="torch",
                              pin_memory=kind == "shmload pinned", timeout=120)


def one_run(kind: str, shape: tuple, batch: int, batches: int) -> dict:
    import torch
    loader = _loader(kind, shape, batch, batches)
    stream = torch.cuda.Stream()
    copied = copy_s = 0.0
    pinned = 0
    start = time.perf_counter()
    for images, _labels in loader:
        pinned += bool(images.is_pinned())
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            on_gpu = images.to("cuda", non_blocking=True)
        stream.synchronize()
        copy_s += time.perf_counter() - t0
        copied += images.numel() * images.element_size()
        del on_gpu, images
    wall = time.perf_counter() - start
    if hasattr(loader, "close"):
        loader.close()
    return {"gb_per_s": copied / copy_s / 1e9, "batches_per_s": batches / wall, "pinned": pinned}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="2 runs of 8 batches: a smoke test, not a figure")
    args = parser.parse_args(argv)
    reason = _cuda_or_reason()
    if reason is not None:
        print(f"benchmarks.pinned: skipped, nothing measured: {reason}. Pinned host-to-device copies need a GPU.")
        return 0
    runs, batches = (2, 8) if args.quick else (args.runs, args.batches)
    kinds = ("shmload pinned", "torch pinned", "shmload pageable")
    gpu = __import__("torch").cuda.get_device_name()
    print(f"{runs} runs of {batches} batches each, 2 workers, medians; GPU: {gpu}")
    print("| batch | loader | H2D GB/s | batches/s | batches pinned |")
    print("|---|---|---|---|---|")
    for label, (shape, batch) in SHAPES.items():
        results: dict[str, list[dict]] = {k: [] for k in kinds}
        for r in range(runs):
            for kind in (kinds if r % 2 == 0 else kinds[::-1]):  # alternate, so drift hits all alike
                results[kind].append(one_run(kind, shape, batch, batches))
        for kind in kinds:
            rs = results[kind]
            print(f"| {label} | {kind} | {statistics.median(x['gb_per_s'] for x in rs):.2f} | "
                  f"{statistics.median(x['batches_per_s'] for x in rs):.1f} | {rs[-1]['pinned']}/{batches} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
