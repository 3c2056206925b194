"""One Lightning fit() over an elastic shmload.DataLoader, for tests/test_lightning_elastic.py.

    python tests/lightning_elastic_job.py --devices N --record PATH --root DIR [--epochs 2] [--samples 32]
        [--global-batch 6] [--workers 1] [--strategy ddp_fork] [--stop-at STEP --checkpoint PATH] [--resume PATH]

Each rank's loader reads ``--global-batch // --devices`` samples a batch, so the global
batch is the same for every ``--devices``. ``--devices 1`` uses Lightning's single-device
strategy (no process group: the loader is a world of one); more use ``--strategy``, DDP
on the CPU with gloo (``ddp_fork`` by default: the test's docstring says why; ``ddp``
and ``ddp_spawn`` work too).

Every training step the ranks' batches (sample ids, and the augmentation each sample drew
from Python's, numpy's and torch's global RNGs in ``__getitem__``) are gathered, and rank 0
appends the step's global batch to ``--record`` as a JSON line: ``[epoch, global_step,
world size, [rank 0's ids, rank 1's, ...], [rank 0's augmentations, ...]]``, written at
once so that a run stopped later keeps it.

``--stop-at STEP``: after that many optimizer steps, ``trainer.save_checkpoint(--checkpoint)``
(every rank builds it, rank 0 writes it), then ``trainer.should_stop`` on every rank: no
batch is read after the checkpoint, as in a job killed there. ``--resume PATH``:
``fit(ckpt_path=PATH)``.

It prints a line per event for the test: ``EVENT {json}``, with the rank and world size:
``saved`` (each rank's ``loader.state_dict()`` at the checkpoint), ``loaded`` (each call
of the loader's ``load_state_dict`` by Lightning, with the state given), ``done`` (each
rank's global step at the end of fit()).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

import numpy as np
import pytorch_lightning as pl
import torch
import torch.distributed as dist

import shmload


def world() -> tuple[int, int]:
    """(world size, rank): torch.distributed's, or a world of one without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def event(kind: str, **fields) -> None:
    size, rank = world()
    line = "EVENT " + json.dumps(dict(fields, event=kind, rank=rank, world=size)) + "\n"
    os.write(1, line.encode())  # one write of a whole line (under PIPE_BUF): the ranks' lines never mix


class Augmented:
    """Sample i: its id and three draws from the global RNGs (random, numpy, torch), as an
    augmentation draws them; shmload seeds them per sample in an elastic epoch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        drawn = [random.random(), float(np.random.random()), float(torch.rand(()))]
        return {"id": i, "aug": np.array(drawn, dtype=np.float64)}


class Loader(shmload.DataLoader):
    """shmload's loader, telling when Lightning hands it a state."""

    def load_state_dict(self, state: dict) -> None:
        sampler = state["sampler"]
        event("loaded", epoch=state["epoch"], position=sampler.get("position"), elastic=sampler.get("elastic"),
              global_batch_size=sampler.get("global_batch_size"))
        super().load_state_dict(state)


class Recorder(pl.LightningModule):
    def __init__(self, record: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.record = record

    def training_step(self, batch, batch_idx):
        mine = (batch["id"].tolist(), batch["aug"].tolist())
        size, rank = world()
        gathered = [None] * size
        if size > 1:
            dist.all_gather_object(gathered, mine)
        else:
            gathered = [mine]
        if rank == 0:
            line = [self.current_epoch, self.global_step, size, [ids for ids, _ in gathered],
                    [aug for _, aug in gathered]]
            with open(self.record, "a") as f:
                f.write(json.dumps(line) + "\n")
        return self.layer(batch["aug"].float()).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class CheckpointAndStop(pl.Callback):
    def __init__(self, step: int | None, path: str | None) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)  # (all ranks call it; rank 0 writes)
            state = trainer.train_dataloader.state_dict()  # (this rank's loader)
            event("saved", step=trainer.global_step, epoch=state["epoch"], sampler=state["sampler"])
            trainer.should_stop = True  # (on every rank at once: no batch is read after it)

    def on_fit_end(self, trainer, pl_module):
        event("done", step=trainer.global_step)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--strategy", default="ddp_fork")
    parser.add_argument("--record", required=True)
    parser.add_argument("--root", required=True, help="Lightning's default_root_dir")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--global-batch", type=int, default=6)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--stop-at", type=int, default=None)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    if args.global_batch % args.devices:
        parser.error(f"--global-batch {args.global_batch} is not divisible by --devices {args.devices}")
    torch.set_num_threads(1)  # (no OpenMP pool before ddp_fork forks the ranks)

    loader = Loader(Augmented(args.samples), batch_size=args.global_batch // args.devices, shuffle=True,
                    elastic=True, seed=7, num_workers=args.workers, output="torch", timeout=60)
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=args.devices,
                         strategy=args.strategy if args.devices > 1 else "auto",
                         callbacks=[CheckpointAndStop(args.stop_at, args.checkpoint)],
                         default_root_dir=args.root, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    try:
        trainer.fit(Recorder(args.record), train_dataloaders=loader, ckpt_path=args.resume)
    finally:
        loader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
