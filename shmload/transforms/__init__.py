"""Image transforms with torchvision's semantics, on Pillow and numpy, plus the fused
:func:`train_pipeline` that writes each image straight into the batch.

Random parameters come from Python's ``random``, which the loader seeds per batch, so
augmentations are reproducible for any ``num_workers``.
"""

from .fused import PendingImage, TrainPipeline, train_pipeline
from .ops import MEAN, STD, CenterCrop, Compose, Normalize, RandomHorizontalFlip, RandomResizedCrop, Resize, ToCHW

__all__ = ["MEAN", "STD", "CenterCrop", "Compose", "Normalize", "PendingImage", "RandomHorizontalFlip",
           "RandomResizedCrop", "Resize", "ToCHW", "TrainPipeline", "train_pipeline"]
