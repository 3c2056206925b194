"""The HF Trainer over shmload: train(), and exact mid-epoch resume with ShmloadCheckpoint.

    python examples/hf_trainer_train.py [--epochs 2] [--samples 104] [--batch-size 8] [--workers 2]
                                        [--accumulate 1] [--output-dir DIR] [--checkpoint-at STEP]
                                        [--resume PATH|True] [--record PREFIX] [--ignore-data-skip]
                                        [--elastic]

    torchrun --nproc-per-node=2 examples/hf_trainer_train.py [...]     # two processes

With ``--elastic`` the loader is ``elastic=True``: a checkpoint saved by 2 processes with
``--batch-size 8`` resumes in 1 process with ``--batch-size 16`` (the same global batch),
on the same global sequence (docs/distributed.md).

The recipe (docs/integrations.md)::

    from shmload.integrations import ShmloadCheckpoint

    class ShmloadTrainer(Trainer):
        def get_train_dataloader(self):
            return shmload.DataLoader(self.train_dataset, batch_size=self.args.per_device_train_batch_size,
                                      shuffle=True, seed=0, num_workers=2, output="torch")

    trainer = ShmloadTrainer(model=model, args=args, train_dataset=dataset,
                             callbacks=[ShmloadCheckpoint()])
    trainer.train(resume_from_checkpoint=True)      # or None for a new run, or a checkpoint's path

What the Trainer does with the loader, and why it is right:

- It uses the loader as it is (it rebuilds only torch's): ``len()``, then before every
  epoch ``set_epoch(epoch)`` and ``iter()``. ``output="torch"``: it moves only tensors to
  the device.
- ``ShmloadCheckpoint`` writes ``loader.state_dict()`` of the last optimizer step into
  every checkpoint folder (``checkpoint-<step>/shmload_loader.json``) and, on a resume,
  loads it and makes the Trainer's skip of the trained batches return the loader itself,
  resumed (accelerate's ``skip_first_batches`` would rebuild it as a torch DataLoader
  with other batches). The resumed run trains on exactly the batches (samples and
  augmentations) of an uninterrupted run, with any ``gradient_accumulation_steps``.
- Leave ``ignore_data_skip=False`` (the default): ``--ignore-data-skip`` shows the error.

The dataset draws a random augmentation from numpy's global generator in every
``__getitem__``, as augmentations do; shmload seeds it per batch, so the samples are
the same for any ``num_workers`` and after a resume.

``--checkpoint-at STEP`` saves a checkpoint after that many optimizer steps and stops
(as a job killed there would, with its last checkpoint); ``--resume`` continues from one
(``True``: the last in ``--output-dir``). ``--record PREFIX`` appends, per rank, to
``PREFIX.rank<r>.jsonl`` a line for every batch the model trained on: [epoch, sample ids,
a checksum of the augmented features]. The last line printed is JSON: the steps trained
and the final weights. Under ``torchrun --nproc-per-node=2`` each rank trains on its
share (the loader shards itself) and saves its own position. Exit status: 0 done (or
stopped at the checkpoint), 2 for a command-line error, 3 without torch or transformers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import shmload
from shmload.tools.synthetic import SyntheticRegression

EXIT_NEEDS_PACKAGES = 3


try:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from shmload.integrations import ShmloadCheckpoint
except ImportError as exc:  # main() says what to install
    torch = None
    MISSING = exc
else:
    class Regression(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def forward(self, x, y, id=None):  # the Trainer calls model(**batch) and reads "loss"
            return {"loss": torch.nn.functional.mse_loss(self.layer(x).squeeze(1), y)}

    class ShmloadTrainer(Trainer):
        """The whole change from torch's DataLoader: get_train_dataloader() returns shmload's."""

        def __init__(self, *args, workers: int = 2, record: str | None = None, elastic: bool = False,
                     **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.workers, self.record, self.elastic, self.loader = workers, record, elastic, None

        def get_train_dataloader(self):
            # distributed=True: under torchrun, read this rank's share without a message
            self.loader = shmload.DataLoader(self.train_dataset, batch_size=self.args.per_device_train_batch_size,
                                             shuffle=True, seed=0, num_workers=self.workers, output="torch",
                                             distributed=True, timeout=60, elastic=self.elastic)
            return self.loader

        def training_step(self, model, inputs, num_items_in_batch=None):
            if self.record:  # a line per batch, written at once: a job stopped later keeps it
                # state.epoch is e + (the epoch's batches trained)/(its batches), as of the last step
                seen = (math.floor(self.state.epoch), inputs["id"].tolist(), round(float(inputs["x"].sum()), 4))
                with open(f"{self.record}.rank{self.args.process_index}.jsonl", "a") as f:
                    f.write(json.dumps(seen) + "\n")
            return super().training_step(model, inputs, num_items_in_batch)

    class SaveAndStop(TrainerCallback):
        """Save a checkpoint after optimizer step ``step`` and stop there."""

        def __init__(self, step: int) -> None:
            self.step = step

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == self.step:
                control.should_save = control.should_training_stop = True


def resume_arg(value: str) -> str | bool:
    return True if value == "True" else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=104)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--accumulate", type=int, default=1, help="gradient_accumulation_steps")
    parser.add_argument("--output-dir", default="shmload-hf-trainer", metavar="DIR")
    parser.add_argument("--checkpoint-at", type=int, default=None, metavar="STEP")
    parser.add_argument("--resume", type=resume_arg, default=None, metavar="PATH|True")
    parser.add_argument("--record", default=None, metavar="PREFIX")
    parser.add_argument("--ignore-data-skip", action="store_true", help="to see ShmloadCheckpoint refuse it")
    parser.add_argument("--elastic", action="store_true",
                        help="elastic=True: resume on another number of processes (keep batch-size x processes)")
    args = parser.parse_args(argv)
    if torch is None:
        print(f"this example needs torch and transformers ({MISSING}): pip install 'shmload[hf]' "
              "(transformers==5.23.0, accelerate==1.15.0, torch==2.13.0)", file=sys.stderr)
        return EXIT_NEEDS_PACKAGES

    training_args = TrainingArguments(
        output_dir=args.output_dir, num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.accumulate, learning_rate=0.05, save_strategy="no",
        ignore_data_skip=args.ignore_data_skip, logging_strategy="no", report_to="none", use_cpu=True,
        disable_tqdm=True, ddp_find_unused_parameters=False)
    torch.manual_seed(0)
    callbacks = [ShmloadCheckpoint()]
    if args.checkpoint_at is not None:
        callbacks.append(SaveAndStop(args.checkpoint_at))
    trainer = ShmloadTrainer(model=Regression(), args=training_args, train_dataset=SyntheticRegression(args.samples),
                             callbacks=callbacks, workers=args.workers, record=args.record, elastic=args.elastic)
    try:
        trainer.train(resume_from_checkpoint=args.resume)
    finally:
        if trainer.loader is not None:
            trainer.loader.close()
    weights = [float(v) for v in torch.cat([p.detach().flatten() for p in trainer.model.parameters()])]
    if trainer.is_world_process_zero():  # one line, whatever the number of processes
        print(json.dumps({"global_step": trainer.state.global_step, "weights": weights}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
