r"""Elastic data-parallel training: one global batch sequence on any number of ranks, and a
checkpoint that resumes it on another number.

    torchrun --standalone --nproc-per-node=2 examples/elastic_ddp.py --checkpoint ckpt.json
    torchrun --standalone --nproc-per-node=3 examples/elastic_ddp.py --checkpoint ckpt.json
    python examples/elastic_ddp.py --checkpoint ckpt.json      # a world of one, no torchrun

Stop the first (Ctrl-C, or ``--stop-after 4``), and the second resumes the global sequence
from the checkpoint, on 3 ranks instead of 2. torchrun's elastic agent does that by
itself: when a rank fails or a node comes or goes, it restarts every rank with the new
world size, and they resume from the checkpoint. Start this, then the same command again
in another terminal: the job grows to 4 ranks; stop the second and it shrinks back to 2:

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=1:2 --nproc-per-node=2 \
        --max-restarts=3 --rdzv-backend=c10d --rdzv-endpoint=localhost:29400 \
        examples/elastic_ddp.py --checkpoint ckpt.json --samples 60000

(It waits 30 s for a second node before it starts alone. Without the variable, torch
2.13's agent keeps one store across restarts, and the restarted ranks' gloo fails to
connect to the previous ranks' addresses: "Connection refused", pytorch/pytorch#135712.)

On each of the W ranks (gloo, CPU), ``shmload.DataLoader(dataset, batch_size=G // W,
shuffle=True, elastic=True, seed=S)`` loads the rank's slice of every global batch of G
samples (``--global-batch``, default 12: 1, 2, 3, 4, 6 or 12 ranks; W must divide it).
Global batch k (rank 0's k-th batch, then rank 1's, ...) is the same for any W and any
``--workers``, augmentations included: sample i is ``(i, [random.random(),
np.random.rand(), torch.rand(())])``, drawn from the global RNGs as random transforms
draw, which shmload seeds for each sample from (seed, epoch, its place in the epoch).
The ranks average their gradients, so each step of the toy model (learning y = x . (1, 2,
3)) is the global batch's, whatever W. (A real model is wrapped in torch's
DistributedDataParallel, which averages them in backward(), and stepped by an optimizer;
this 4-parameter one does both by hand, sparing every rank their import of torch._dynamo,
seconds of the example's run.)

Every ``--every`` steps, rank 0 writes the checkpoint as JSON, atomically (a temporary
file renamed over it): the step, the model's weights and ``loader.state_dict()``, which
is the same on every rank (it holds the global position; checked here). On start, rank 0
reads it and broadcasts it, and every rank loads it: the loader continues the global
sequence on any world size. ``--report PATH``: rank 0 gathers every rank's batches and
writes the global sequence this run delivered, per global batch the ranks' indices and
augmentations, as JSON. ``--workers 0 1 2`` runs the job once per count, each from the
start (no checkpoint), to compare. Exit status 0, 2 for a command-line error, 3 without
torch (``pip install torch==2.13.0``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

import numpy as np

import shmload

try:
    import torch
    import torch.distributed as dist
except ImportError as exc:
    torch, missing = None, exc

EXIT_NEEDS_TORCH = 3


class Augmented:
    """``n`` samples ``(i, three augmentation values)`` drawn from the global RNGs."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for {self.n} samples")
        return np.int64(i), np.array([random.random(), np.random.rand(), torch.rand(()).item()])


def sgd_step(model, lr: float = 0.1) -> None:
    """DistributedDataParallel's all-reduce (the mean gradient over the ranks), then SGD's step."""
    for p in model.parameters():
        dist.all_reduce(p.grad)
        with torch.no_grad():
            p -= lr * p.grad / dist.get_world_size()
        p.grad = None


def load_checkpoint(path: str | None) -> dict | None:
    """The checkpoint, read by rank 0 and broadcast (None if there is none yet)."""
    box = [None]
    if dist.get_rank() == 0 and path and os.path.exists(path):
        with open(path) as f:
            box[0] = json.load(f)
    dist.broadcast_object_list(box, src=0)
    return box[0]


def save_checkpoint(path: str, step: int, loader, model) -> None:
    state = loader.state_dict()
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    if any(s != state for s in states):
        raise RuntimeError(f"the ranks' loader states differ: {states}")
    if dist.get_rank() == 0:
        weights = {k: v.tolist() for k, v in model.state_dict().items()}
        with open(path + ".tmp", "w") as f:
            json.dump({"step": step, "loader": state, "model": weights}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)  # a reader sees the old checkpoint or the new, never half of one


def train(args, workers: int, checkpoint: str | None) -> dict:
    """One job: the epochs left (all of them, without a checkpoint); this rank's batches."""
    saved = load_checkpoint(checkpoint)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Linear(3, 1, dtype=torch.float64)
    if saved:
        model.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in saved["model"].items()})
    target = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    step = first = saved["step"] if saved else 0
    batches = []
    world = dist.get_world_size()
    with shmload.DataLoader(Augmented(args.samples), batch_size=args.global_batch // world, shuffle=True,
                            elastic=True, seed=args.seed, num_workers=workers, persistent_workers=workers > 0,
                            output="torch") as loader:
        if saved:
            loader.load_state_dict(saved["loader"])  # rank 0's state, on every rank: any world size
        if dist.get_rank() == 0:
            print(f"{world} rank(s) x {args.global_batch // world} samples a batch, {workers} workers each"
                  + (f", resuming after step {step}" if saved else ""), flush=True)
        for epoch in range(saved["loader"]["epoch"] if saved else 0, args.epochs):
            loader.set_epoch(epoch)  # (the saved epoch keeps the loaded position)
            for index, x in loader:
                loss = ((model(x).squeeze(1) - x @ target) ** 2).mean()
                loss.backward()
                sgd_step(model)  # with the global batch's gradient, the same on every rank
                step += 1
                batches.append({"epoch": epoch, "step": step, "indices": index.tolist(),
                                "augmentations": x.tolist()})
                saving = checkpoint and (step % args.every == 0 or step == args.stop_after)
                if saving:
                    save_checkpoint(checkpoint, step, loader, model)
                if dist.get_rank() == 0 and (saving or step % args.every == 0):
                    print(f"epoch {epoch} step {step}: loss {loss.item():.4f} (rank 0's)"
                          + (", checkpoint saved" if saving else ""), flush=True)
                if step == args.stop_after:
                    return {"workers": workers, "first_step": first, "stopped": True, "batches": batches}
        if checkpoint:
            save_checkpoint(checkpoint, step, loader, model)  # done: a rerun has nothing left to do
    return {"workers": workers, "first_step": first, "stopped": False, "batches": batches}


def write_report(path: str, args, runs: list[dict]) -> None:
    """Rank 0 writes the global sequence of each run: per global batch, every rank's slice."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, runs)
    if dist.get_rank() != 0:
        return
    for j, run in enumerate(runs):
        slices = [ranks[j]["batches"] for ranks in everyone]
        if any([b["step"] for b in s] != [b["step"] for b in slices[0]] for s in slices):
            raise RuntimeError("the ranks delivered different batches")  # (never: they step together)
        run["batches"] = [{"epoch": b["epoch"], "step": b["step"], "indices": [s[k]["indices"] for s in slices],
                           "augmentations": [s[k]["augmentations"] for s in slices]} for k, b in enumerate(slices[0])]
    report = {"world_size": dist.get_world_size(), "global_batch": args.global_batch, "samples": args.samples,
              "seed": args.seed, "epochs": args.epochs, "runs": runs}
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="loader workers per rank (default 2)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs (default 2)")
    parser.add_argument("--samples", type=int, default=100, help="samples in the dataset (default 100)")
    parser.add_argument("--global-batch", type=int, default=12, help="samples per step, all ranks together (12)")
    parser.add_argument("--seed", type=int, default=0, help="the order's and augmentations' seed (default 0)")
    parser.add_argument("--checkpoint", metavar="PATH", help="resume from PATH if it exists; save to it")
    parser.add_argument("--every", type=int, default=5, help="steps between checkpoints (default 5)")
    parser.add_argument("--stop-after", type=int, metavar="STEPS", help="exit after step STEPS's checkpoint")
    parser.add_argument("--report", metavar="PATH", help="rank 0 writes the global sequence here as JSON")
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's, for each (re)start
    if args.global_batch < 1 or args.global_batch % world:
        parser.error(f"--global-batch {args.global_batch} is not divisible by the world size {world}: each rank "
                     "loads an equal slice of every global batch. Choose a global batch that every world size "
                     "the job may run with divides")
    if min(args.workers) < 0 or args.samples < 1 or args.every < 1:
        parser.error("--workers should be at least 0, --samples and --every positive")
    if (len(args.workers) > 1 and args.checkpoint) or (args.stop_after is not None and not args.checkpoint):
        parser.error("--checkpoint takes one --workers count; --stop-after needs --checkpoint")
    if torch is None:
        print(f"This example needs torch, which is not importable here ({missing}). Install it with:\n\n"
              "    pip install torch==2.13.0\n", file=sys.stderr)
        return EXIT_NEEDS_TORCH
    torch.set_num_threads(1)  # a 4-parameter model: leave the cores to the loader's workers
    if "RANK" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
    else:  # plain python: a world of one, over an in-process store
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        runs = [train(args, workers, args.checkpoint) for workers in args.workers]
        if args.report:
            write_report(args.report, args, runs)
        dist.barrier()  # every rank is done with gloo before any tears it down
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
