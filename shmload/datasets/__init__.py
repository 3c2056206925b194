"""Ready-made map-style datasets: a folder of images, and arrays in memory; and
StringArray, a list of names that forked workers read without copying it."""

from .arrays import ArrayDataset
from .folder import IMG_EXTENSIONS, ImageFolder
from .strings import StringArray

__all__ = ["IMG_EXTENSIONS", "ArrayDataset", "ImageFolder", "StringArray"]
