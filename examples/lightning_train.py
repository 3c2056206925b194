"""PyTorch Lightning over shmload: fit(), exact mid-epoch resume, and DDP without a sampler.

    python examples/lightning_train.py [--epochs 2] [--samples 96] [--batch-size 8] [--workers 2|auto]
                                       [--devices 1] [--strategy auto|ddp_spawn]
                                       [--checkpoint-at STEP --checkpoint PATH] [--resume PATH]
                                       [--model-checkpoint DIR [--every-n-train-steps N]] [--record PREFIX]

The recipe is three lines of a LightningModule (see docs/integrations.md)::

    def train_dataloader(self):
        return shmload.DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2,
                                  seed=0, output="torch")

or hand the loader to ``trainer.fit(model, train_dataloaders=loader)``, as this script
does. What Lightning does with it, and why it is right:

- Lightning calls ``iter()`` once on a loader that is not torch's, as a probe, and drops
  the iterator: shmload's epoch begins at the first batch, so the probe uses up nothing.
- It calls ``sampler.set_epoch(epoch)`` every epoch; shmload's own sampler follows.
- It saves ``loader.state_dict()`` in every checkpoint and calls ``load_state_dict()``
  when resuming with ``ckpt_path=``: the resumed run gets exactly the batches (samples
  and augmentations) an uninterrupted run gets, from any step, in any epoch.
- Under ``strategy="ddp_spawn"`` (or ``"ddp"``) Lightning cannot put a distributed
  sampler into a loader that is not torch's; shmload sees ``torch.distributed`` and
  reads this rank's share by itself (``distributed=True`` says so without a message).

The dataset (``shmload.tools.synthetic.SyntheticRegression``) draws a random augmentation from
numpy's global generator in every ``__getitem__``, as augmentations do; shmload seeds it
per batch, so the samples are the same for any ``num_workers`` and after a resume.

``--checkpoint-at STEP`` saves a checkpoint after that many optimizer steps and stops
(as a job killed there would, with its last checkpoint); ``--resume PATH`` continues from
one. ``--model-checkpoint DIR`` adds Lightning's usual ``ModelCheckpoint(dirpath=DIR,
save_last=True)`` (at each epoch's end, or every N steps with ``--every-n-train-steps``):
``--resume DIR/last.ckpt`` continues from it. ``--record PREFIX`` appends, per rank, to
``PREFIX.rank<r>.jsonl`` a line for every batch the model trained on: [epoch, sample ids, a
checksum of the augmented features]. Exit status:
0 done (or stopped at the checkpoint), 2 for a command-line error, 3 without torch or
Lightning.
"""

from __future__ import annotations

import argparse
import json
import sys

import shmload
from shmload.tools.synthetic import SyntheticRegression

EXIT_NEEDS_PACKAGES = 3


class Stop(Exception):
    """Raised after the checkpoint of --checkpoint-at: the job ends there."""


try:
    import pytorch_lightning as pl
    import torch
except ImportError as exc:  # main() says what to install
    pl = None
    MISSING = exc
else:
    class Regression(pl.LightningModule):
        def __init__(self, record: str | None = None) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)
            self.record = record

        def training_step(self, batch, batch_idx):
            if self.record:  # a line per batch, written at once: a job stopped later keeps it
                seen = (self.current_epoch, batch["id"].tolist(), round(float(batch["x"].sum()), 4))
                with open(f"{self.record}.rank{self.global_rank}.jsonl", "a") as f:
                    f.write(json.dumps(seen) + "\n")
            return torch.nn.functional.mse_loss(self.layer(batch["x"]).squeeze(1), batch["y"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    class CheckpointAndStop(pl.Callback):
        def __init__(self, step: int, path: str) -> None:
            self.step, self.path = step, path

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == self.step:
                trainer.save_checkpoint(self.path)
                raise Stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=lambda v: v if v == "auto" else int(v), default=2,
                        help='a count, or "auto": the loader sizes itself as it runs')
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", default="auto", help="auto, or ddp_spawn with --devices 2")
    parser.add_argument("--checkpoint-at", type=int, default=None, metavar="STEP")
    parser.add_argument("--checkpoint", default="shmload-lightning.ckpt", metavar="PATH")
    parser.add_argument("--resume", default=None, metavar="PATH")
    parser.add_argument("--model-checkpoint", default=None, metavar="DIR")
    parser.add_argument("--every-n-train-steps", type=int, default=None, metavar="N")
    parser.add_argument("--record", default=None, metavar="PREFIX")
    args = parser.parse_args(argv)
    if pl is None:
        print(f"this example needs torch and pytorch-lightning ({MISSING}): pip install 'shmload[lightning]' "
              "(torch==2.13.0, pytorch-lightning==2.6.6)", file=sys.stderr)
        return EXIT_NEEDS_PACKAGES

    callbacks = [CheckpointAndStop(args.checkpoint_at, args.checkpoint)] if args.checkpoint_at is not None else []
    if args.model_checkpoint:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=args.model_checkpoint, save_last=True,
                                                      every_n_train_steps=args.every_n_train_steps))
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=args.devices, strategy=args.strategy,
                         callbacks=callbacks, logger=False, enable_checkpointing=bool(args.model_checkpoint),
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    model = Regression(args.record)
    # the whole change from torch's DataLoader: shmload.DataLoader, plus seed= for
    # repeatable augmentations and distributed=True for sharding without a message
    loader = shmload.DataLoader(SyntheticRegression(args.samples), batch_size=args.batch_size, shuffle=True, seed=0,
                                num_workers=args.workers, output="torch", distributed=True, timeout=60)
    stopped = False
    try:
        trainer.fit(model, train_dataloaders=loader, ckpt_path=args.resume)
    except Stop:
        stopped = True
    finally:
        loader.close()
    print(f"{'stopped at step' if stopped else 'trained'} {trainer.global_step} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
