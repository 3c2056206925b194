"""Data-parallel training with torchrun: one shmload.DataLoader per rank, DDP on the CPU.

    torchrun --nproc-per-node=2 examples/ddp_train.py [--epochs 4] [--samples 1001]
             [--batch-size 32] [--workers 2] [--report report.json]

    python examples/ddp_train.py [...]     # the same, as a world of 1 (no torchrun needed)

What it does, on every rank (one process per rank; torchrun starts them and sets
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``):

1. Joins the process group: ``torch.distributed.init_process_group("gloo")``, CPU only.
   Started without torchrun (``RANK`` not set), it makes a world of one process instead,
   over an in-process store: no port, no launcher, every check below holds trivially.
2. Builds a small synthetic map-style dataset. Sample ``i`` is ``(features, label, i)``:
   16 float32 features drawn from a generator seeded by ``i``, an int64 label that is
   the argmax of the features times a fixed matrix (so a linear model can learn it),
   and the index itself, so that the script can tell which samples each rank saw.
3. Loads its share with ``shmload.DistributedSampler`` (rank and world size from
   ``torch.distributed``) and ``shmload.DataLoader(..., num_workers=2, output="torch")``:
   every rank has its own worker processes and its own shared-memory ring, and its
   batches arrive as ``torch.Tensor``s over the shared memory, without a copy.
4. Trains ``nn.Linear(16, 4)`` wrapped in ``DistributedDataParallel`` for a few epochs,
   calling ``sampler.set_epoch(epoch)`` before each (as with torch's sampler), and
   prints each rank's mean loss per epoch.
5. Checks what data-parallel training promises, on every rank:

   - the shards: in every epoch the ranks' indices together cover the whole dataset,
     and overlap only where the sampler pads (below); each rank received exactly the
     indices of its sampler, in its order; the order changes from epoch to epoch;
   - the parameters: equal on all ranks, bit for bit, right after wrapping in DDP (the
     ranks seed their models *differently*, on purpose: DDP broadcasts rank 0's) and
     after training (DDP averages the gradients, so every rank takes the same steps
     although each saw other samples);
   - the loss: the mean over all ranks is lower in the last epoch than in the first.

Padding. The default ``--samples 1001`` does not divide by 2, and ``drop_last=False``:
like torch's ``DistributedSampler``, shmload's pads the epoch's (shuffled) order by
repeating its head until it divides evenly, so that every rank gets the same number of
samples (a rank with a batch fewer would leave the others waiting in their all-reduce).
The union of the shards is then the whole dataset, and they are disjoint except for
those repeats: ``padding = world_size * ceil(samples / world_size) - samples`` samples
(at most ``world_size - 1``), the first ones of the epoch's order, are seen twice in an
epoch (with fewer samples than ranks, the head repeats more than once). The check is
exactly that: the sum of the shard sizes minus the size of their union equals the
padding. With ``--samples`` a multiple of the world size the padding is 0 and the
shards are strictly disjoint.

Rank 0 prints the checks and, with ``--report PATH``, writes them as JSON: the world
size, every rank's sorted indices in epoch 0, whether the parameters match across
ranks, the first and last epoch's loss, and the result of every check. The exit status
is 0 when every check passes, 1 when one fails (on every rank: they all see the same
gathered data), 2 for a command-line error. The whole job takes a few seconds on two
cores, most of it importing torch.

Needs torch. Without it the example prints the command to install it
(``pip install torch==2.13.0``, the version shmload's ``torch`` extra pins) and exits
with status 3, not 0: nothing was trained.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

import shmload

TORCH_PIN = "torch==2.13.0"
EXIT_NEEDS_TORCH = 3
FEATURES, CLASSES = 16, 4


def import_torch():
    """torch, or None after telling the user how to install it."""
    try:
        import torch
        import torch.distributed
        import torch.nn.parallel
    except ImportError as exc:
        print(f"This example trains a model with torch's DistributedDataParallel, and torch is not "
              f"importable here ({exc}).\nInstall it with:\n\n    pip install {TORCH_PIN}\n\n"
              "(the version shmload is tested with; in a checkout of shmload: pip install -e '.[torch]'). A "
              f"CPU-only build is enough:\n\n    pip install {TORCH_PIN} --index-url "
              "https://download.pytorch.org/whl/cpu",
              file=sys.stderr)
        return None
    return torch


# ---------------------------------------------------------------- the data
class Separable:
    """``n`` samples ``(features, label, index)``, each a pure function of its index."""

    def __init__(self, n: int):
        self.n = n
        self.weights = np.random.default_rng(12345).standard_normal((FEATURES, CLASSES)).astype(np.float32)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for {self.n} samples")
        features = np.random.default_rng(i).standard_normal(FEATURES, dtype=np.float32)
        label = np.int64(np.argmax(features @ self.weights))
        return features, label, np.int64(i)


# ---------------------------------------------------------------- the checks
def shard_checks(epochs_seen: list[list[list[int]]], expected: list[list[int]], samples: int,
                 padding: int) -> dict[str, bool]:
    """``epochs_seen[e][r]``: the indices rank ``r`` received from its loader in epoch
    ``e``, in order; ``expected[e][r]``: those its sampler gives for epoch ``e``."""
    everything = set(range(samples))
    checks = {"cover": True, "disjoint_but_padding": True, "equal_shard_sizes": True, "sampler_order": True}
    for seen, wanted in zip(epochs_seen, expected):
        union = set().union(*map(set, seen))
        checks["cover"] &= union == everything
        checks["disjoint_but_padding"] &= sum(map(len, seen)) - len(union) == padding
        checks["equal_shard_sizes"] &= len({len(s) for s in seen}) == 1
        checks["sampler_order"] &= seen == wanted
    # set_epoch reshuffles: epoch 1's order is not epoch 0's (on rank 0; any rank would do)
    checks["reshuffled"] = len(epochs_seen) < 2 or epochs_seen[0][0] != epochs_seen[1][0]
    return checks


def flat_parameters(torch, model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def parameters_match(torch, dist, model) -> tuple[bool, float]:
    """(every rank's parameters equal rank 0's bit for bit, the largest difference)."""
    mine = flat_parameters(torch, model)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    diff = max(float((p - everyone[0]).abs().max()) for p in everyone)
    return all(torch.equal(p, everyone[0]) for p in everyone), diff


# ---------------------------------------------------------------- the training
def say(line: str) -> None:
    """Print ``line`` in one write: the ranks share torchrun's stdout, and print()'s separate
    writes of the text and of its newline interleave with the other ranks' lines."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4, help="epochs (default 4, at least 2)")
    parser.add_argument("--samples", type=int, default=1001, help="samples in the dataset (default 1001: odd, "
                                                                   "so the sampler pads with 2 ranks)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per rank (default 32)")
    parser.add_argument("--workers", type=int, default=2, help="loader worker processes per rank (default 2)")
    parser.add_argument("--lr", type=float, default=0.05, help="Adam's learning rate (default 0.05)")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds a rank waits for the others, or for a batch, before failing (default 60)")
    parser.add_argument("--report", metavar="PATH", help="rank 0 writes the checks here as JSON")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs should be at least 2 (the first and last epochs' losses are compared)")
    if args.samples < 1 or args.batch_size < 1 or args.workers < 0 or args.timeout <= 0:
        parser.error("--samples and --batch-size should be positive, --workers at least 0, --timeout positive")

    torch = import_torch()
    if torch is None:
        return EXIT_NEEDS_TORCH
    dist = torch.distributed
    # A 68-parameter model: one thread is plenty, and leaves the cores to the loader's workers.
    torch.set_num_threads(1)

    timeout = datetime.timedelta(seconds=args.timeout)
    if "RANK" in os.environ:  # started by torchrun (or another launcher setting the env:// variables)
        dist.init_process_group("gloo", timeout=timeout)
    else:  # plain `python examples/ddp_train.py`: a world of one, over an in-process store
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    try:
        status = train(torch, dist, args)
        # every rank is done with gloo before any tears it down: a rank destroying the group
        # while another still talks to it can abort ("terminate called without an active
        # exception"), seen once under a loaded machine
        dist.barrier()
        return status
    finally:
        dist.destroy_process_group()


def train(torch, dist, args) -> int:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    tag = f"[rank {rank}/{world_size}]"
    start = time.perf_counter()

    dataset = Separable(args.samples)
    # rank and world size come from torch.distributed; the seed must be the same on every rank
    sampler = shmload.DistributedSampler(dataset, shuffle=True, seed=0, drop_last=False)
    padding = sampler.total_size - len(dataset)
    if rank == 0:
        print(f"{world_size} rank(s), {args.samples} samples: {sampler.num_samples} per rank "
              f"({padding} padded), batches of {args.batch_size}, {args.workers} workers per rank", flush=True)

    torch.manual_seed(rank)  # different initial weights on purpose: DDP broadcasts rank 0's
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(FEATURES, CLASSES))
    match_at_start, _ = parameters_match(torch, dist, model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()

    losses = []  # mean over all ranks' samples, per epoch
    seen = []  # seen[e]: the indices this rank received in epoch e, in order
    with shmload.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                            persistent_workers=args.workers > 0, seed=0, output="torch",
                            timeout=args.timeout if args.workers > 0 else 0) as loader:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)  # a new order each epoch, the same on every rank
            indices, loss_sum, batches = [], 0.0, 0
            for features, labels, index in loader:
                # float32 [B, 16], int64 [B], int64 [B]: tensors over this rank's shared memory
                loss = loss_fn(model(features), labels)
                optimizer.zero_grad()
                loss.backward()  # DDP all-reduces (averages) the gradients across the ranks here
                optimizer.step()
                indices += index.tolist()
                loss_sum += loss.item() * len(labels)
                batches += 1
            seen.append(indices)
            say(f"{tag} epoch {epoch}: loss {loss_sum / len(indices):.4f} over {batches} batches "
                f"({len(indices)} samples)")
            total = torch.tensor([loss_sum, len(indices)], dtype=torch.float64)
            dist.all_reduce(total)
            losses.append(float(total[0] / total[1]))

    match_at_end, max_diff = parameters_match(torch, dist, model)

    # What each rank's sampler says it should have received, to compare with what came out of the loader.
    replay = shmload.DistributedSampler(dataset, shuffle=True, seed=0, drop_last=False)
    wanted = []
    for epoch in range(args.epochs):
        replay.set_epoch(epoch)
        wanted.append(list(replay))
    gathered_seen = [None] * world_size
    gathered_wanted = [None] * world_size
    dist.all_gather_object(gathered_seen, seen)
    dist.all_gather_object(gathered_wanted, wanted)
    by_epoch = [[gathered_seen[r][e] for r in range(world_size)] for e in range(args.epochs)]
    expected = [[gathered_wanted[r][e] for r in range(world_size)] for e in range(args.epochs)]

    checks = shard_checks(by_epoch, expected, args.samples, padding)
    # the indices more than one rank received in epoch 0: the padded repeats (one rank may
    # also receive one twice, when the padding wraps around a dataset smaller than the world)
    counts = np.bincount(np.concatenate([np.asarray(s, np.int64) for s in by_epoch[0]]), minlength=args.samples)
    repeated = np.flatnonzero(counts > 1).tolist()
    checks["params_match_at_start"] = match_at_start
    checks["params_match"] = match_at_end
    checks["loss_fell"] = losses[-1] < losses[0]
    ok = all(checks.values())
    elapsed = time.perf_counter() - start

    if rank == 0:
        print(f"mean loss over all ranks per epoch: {' '.join(f'{x:.4f}' for x in losses)}")
        print(f"epoch 0 shards: sizes {[len(s) for s in by_epoch[0]]}, union {len(set().union(*map(set, by_epoch[0])))}"
              f" of {args.samples} samples, seen more than once: {repeated} (padding: {padding})")
        print(f"parameters across ranks: {'identical' if match_at_end else 'DIFFERENT'} "
              f"(largest difference {max_diff:g})")
        for name, passed in checks.items():
            print(f"check {name}: {'OK' if passed else 'FAILED'}")
        print(f"{'all checks passed' if ok else 'SOME CHECKS FAILED'} in {elapsed:.1f} s", flush=True)
        if args.report:
            report = {
                "world_size": world_size,
                "samples": args.samples,
                "batch_size": args.batch_size,
                "workers": args.workers,
                "epochs": args.epochs,
                "per_rank": sampler.num_samples,
                "padding": padding,
                "indices_epoch0": [sorted(s) for s in by_epoch[0]],
                "repeated_epoch0": repeated,
                "params_match": match_at_end,
                "params_match_at_start": match_at_start,
                "max_param_diff": max_diff,
                "losses": losses,
                "first_loss": losses[0],
                "last_loss": losses[-1],
                "checks": checks,
                "ok": ok,
                "seconds": elapsed,
            }
            with open(args.report, "w") as f:
                json.dump(report, f)
    if not ok:
        print(f"{tag} failed checks: {[name for name, passed in checks.items() if not passed]}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
