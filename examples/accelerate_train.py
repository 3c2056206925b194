"""HF accelerate over shmload: sharding, gradient accumulation that sees each epoch's end,
and exact resume with save_state()/load_state().

    torchrun --nproc-per-node=2 examples/accelerate_train.py [--epochs 2] [--samples 90]
             [--batch-size 4] [--accumulate 4] [--workers 1] [--record PREFIX]
             [--checkpoint-at BATCH --checkpoint DIR] [--resume DIR] [--plain]

    python examples/accelerate_train.py [...]      # one process

The recipe (docs/integrations.md)::

    accelerator = Accelerator(gradient_accumulation_steps=4)
    loader = for_accelerate(shmload.DataLoader(dataset, batch_size=4, shuffle=True, seed=0,
                                               num_workers=2, output="torch"))
    model, optimizer = accelerator.prepare(model, optimizer)   # the loader is not prepared
    accelerator.register_for_checkpointing(loader)             # its position goes into save_state()
    for epoch in range(loader.state_dict()["epoch"], epochs):  # after load_state(): the saved epoch
        loader.set_epoch(epoch)
        for batch in loader:
            with accelerator.accumulate(model):
                ...

Why each line: ``accelerator.prepare(loader)`` would return a shmload loader unchanged
(accelerate rebuilds only torch's), so it is not passed. Under several processes the
loader shards by itself (``torch.distributed`` is initialized by then). accelerate learns
where an epoch ends only from a loader of its own kind: ``for_accelerate`` (shmload's
adapter) gives it that, so the last, partial accumulation window of each epoch is
stepped, as with torch's loader; ``--plain`` leaves it out, to show the difference.
``register_for_checkpointing`` puts ``loader.state_dict()`` into ``save_state()``:
``load_state()`` resumes the epoch exactly where it was saved, which is also how to
skip batches (accelerate's ``skip_first_batches`` would return a torch DataLoader).

``--record PREFIX`` appends, per rank, to ``PREFIX.rank<r>.jsonl`` a line per batch:
[epoch, sample ids, augmentation checksum, sync_gradients, end_of_dataloader].
``--checkpoint-at N`` saves the state after the N-th batch of the run and stops there.
Exit status: 0 done, 2 command-line error, 3 without torch or accelerate.
"""

from __future__ import annotations

import argparse
import json
import sys

import shmload
from shmload.integrations import for_accelerate
from shmload.tools.synthetic import SyntheticRegression

EXIT_NEEDS_PACKAGES = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=90)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--accumulate", type=int, default=4, help="gradient_accumulation_steps")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--record", metavar="PREFIX")
    parser.add_argument("--checkpoint-at", type=int, metavar="BATCH")
    parser.add_argument("--checkpoint", default="shmload-accelerate-state", metavar="DIR")
    parser.add_argument("--resume", metavar="DIR")
    parser.add_argument("--plain", action="store_true", help="without for_accelerate(): accelerate misses the end")
    args = parser.parse_args(argv)
    try:
        import torch
        from accelerate import Accelerator
    except ImportError as exc:
        print(f"this example needs torch and accelerate ({exc}): pip install 'shmload[accelerate]' "
              "(torch==2.13.0, accelerate==1.15.0)", file=sys.stderr)
        return EXIT_NEEDS_PACKAGES

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulate)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = shmload.DataLoader(SyntheticRegression(args.samples), batch_size=args.batch_size, shuffle=True, seed=0,
                                num_workers=args.workers, output="torch", distributed=True, timeout=60)
    if not args.plain:
        loader = for_accelerate(loader)
    accelerator.register_for_checkpointing(loader)
    if args.resume:
        accelerator.load_state(args.resume)

    batches = 0
    try:
        for epoch in range(loader.state_dict()["epoch"], args.epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                with accelerator.accumulate(model):
                    loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                if args.record:
                    line = [epoch, batch["id"].tolist(), round(float(batch["x"].sum()), 4),
                            accelerator.sync_gradients, accelerator.gradient_state.end_of_dataloader]
                    with open(f"{args.record}.rank{accelerator.process_index}.jsonl", "a") as f:
                        f.write(json.dumps(line) + "\n")
                batches += 1
                if batches == args.checkpoint_at:
                    break
            if batches == args.checkpoint_at:  # (state_dict() still knows where the loop left)
                accelerator.save_state(args.checkpoint)
                print(f"saved after batch {batches}, stopping")
                break
        # every process is done with the group before end_training() tears it down
        accelerator.wait_for_everyone()
    finally:
        loader.close()
        accelerator.end_training()
    if accelerator.is_main_process and batches != args.checkpoint_at:
        print(f"trained {batches} batches per process on {accelerator.num_processes} process(es)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
