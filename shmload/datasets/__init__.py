"""Ready-made map-style datasets: a folder of images, and arrays in memory."""

from .arrays import ArrayDataset
from .folder import IMG_EXTENSIONS, ImageFolder

__all__ = ["IMG_EXTENSIONS", "ArrayDataset", "ImageFolder"]
