"""Quick start: wrap a synthetic image dataset and iterate an epoch.

    python examples/quickstart.py [--workers 2] [--batches 50]

Each sample is a 3x224x224 uint8 image plus an int label, as an ImageNet-style pipeline
would produce after cropping. The same epoch is loaded in the main process and with
worker processes, and the two are checked to be bit-identical.
"""

import argparse
import time

import numpy as np

import shmload


class SyntheticImages:
    """Any object with __getitem__ and __len__ will do."""

    def __init__(self, n: int, size: int = 224):
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        image = rng.integers(0, 256, (3, self.size, self.size), dtype=np.uint8)
        if np.random.rand() < 0.5:  # a random flip, seeded per batch by the loader
            image = image[:, :, ::-1]
        return {"image": image, "label": i % 1000}


def run(loader: shmload.DataLoader) -> tuple[float, list[int]]:
    start = time.perf_counter()
    checksums = []
    for batch in loader:  # batch["image"]: uint8 [64, 3, 224, 224], a view into shared memory
        checksums.append(int(batch["image"][:, :, ::16, ::16].sum()) + int(batch["label"].sum()))
    return time.perf_counter() - start, checksums


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=50)
    args = parser.parse_args()
    dataset = SyntheticImages(64 * args.batches)

    single = shmload.DataLoader(dataset, batch_size=64, shuffle=True, seed=0)
    t_single, ref = run(single)

    with shmload.DataLoader(dataset, batch_size=64, shuffle=True, seed=0, num_workers=args.workers,
                            persistent_workers=True) as loader:
        t_workers, got = run(loader)
        print(loader)

    mb = 64 * 3 * 224 * 224 / 1e6
    print(f"{len(got)} batches of {mb:.1f} MB")
    print(f"main process only : {len(ref) / t_single:6.1f} batches/s")
    print(f"{args.workers} workers         : {len(got) / t_workers:6.1f} batches/s "
          f"(x{t_single / t_workers:.2f}; this machine has {__import__('os').cpu_count()} cores)")
    assert got == ref, "workers and the main process produced different batches"
    print("batches are bit-identical to the single-process run: OK")


if __name__ == "__main__":
    main()
