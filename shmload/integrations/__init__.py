"""Adapters for the trainers people hand their loader to, where the trainer needs more
than torch's DataLoader interface gives it (see docs/integrations.md).

- :func:`for_accelerate` (``hf_accelerate.py``): accelerate's gradient accumulation
  sees the end of each epoch.
- :class:`ShmloadCheckpoint` (``hf_trainer.py``): the HF Trainer saves the loader's
  position in its checkpoints and resumes it exactly.

Lightning and torchrun DDP scripts need no adapter. Each adapter imports its trainer
only when called, so ``import shmload`` never imports them.
"""

from .hf_accelerate import for_accelerate
from .hf_trainer import ShmloadCheckpoint

__all__ = ["ShmloadCheckpoint", "for_accelerate"]
