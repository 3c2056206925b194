"""ImageFolder: ``root/<class>/<file>`` images as a map-style dataset.

The file list is a :class:`~shmload.datasets.StringArray` of relative paths and an
``int64`` array of labels, not a Python list of strings: a forked worker that reads a
list of a million paths slowly copies every page they sit on, because reading a Python
object writes its reference count (the memory growth users report against PyTorch's
DataLoader with large file lists; strings.py says more). Measured in
``benchmarks/imagefolder_scale.py`` (figures in docs/performance.md).

Scanning uses ``os.scandir``, whose entries know from the directory listing whether they
are files (no ``stat`` per file except for symbolic links), so a folder of 1.3 million
files is listed in seconds.
"""

from __future__ import annotations

import operator
import os
import warnings
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..errors import ImageDecodeError, ShmloadWarning
from .strings import StringArray

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
MAX_SKIPS = 16  # on_error="skip": how many unreadable files in a row before giving up


_DECODE_ERRORS: tuple[type[BaseException], ...] = ()


def _decode_errors() -> tuple[type[BaseException], ...]:
    global _DECODE_ERRORS
    if not _DECODE_ERRORS:
        from PIL import Image

        # What Pillow raises for a file it cannot read: UnidentifiedImageError and
        # "image file is truncated" are OSErrors; some plugins raise SyntaxError.
        _DECODE_ERRORS = (OSError, SyntaxError, Image.DecompressionBombError)
    return _DECODE_ERRORS


def find_classes(root: str) -> list[str]:
    """The class folders directly under ``root``, sorted (torchvision's rule)."""
    try:
        with os.scandir(root) as it:
            classes = sorted(e.name for e in it if e.is_dir())
    except FileNotFoundError:
        raise FileNotFoundError(f"ImageFolder: the root folder {root!r} does not exist") from None
    except NotADirectoryError:
        raise NotADirectoryError(f"ImageFolder: the root {root!r} is a file, expected a folder of class "
                                 "folders (root/<class>/<image>)") from None
    if not classes:
        raise FileNotFoundError(f"ImageFolder: no class folders in {root!r}; expected the layout "
                                "root/<class>/<image>")
    return classes


def _walk(folder: str, rel: str, extensions: tuple[str, ...], out: list[str]) -> None:
    """Append the image files under ``folder`` (as paths relative to the root, starting
    with ``rel``): a folder's own files sorted by name, then its subfolders, sorted."""
    with os.scandir(folder) as it:
        entries = sorted(it, key=lambda e: e.name)
    subfolders = []
    for e in entries:
        if e.is_dir():
            subfolders.append(e.name)
        elif e.name.lower().endswith(extensions) and e.is_file():
            out.append(rel + e.name)
    for name in subfolders:
        _walk(os.path.join(folder, name), rel + name + "/", extensions, out)


def scan(root: str, classes: Sequence[str], extensions: tuple[str, ...],
         allow_empty: bool = False) -> tuple[StringArray, np.ndarray]:
    """The images under ``root/<class>``: (relative paths, labels)."""
    counts: list[int] = []

    def names() -> Iterator[str]:
        # Class by class, so the Python strings of only one class exist at a time (a million
        # of them at once would take several times the arrays' size at the peak).
        for cls in classes:
            found: list[str] = []
            _walk(os.path.join(root, cls), cls + "/", extensions, found)
            counts.append(len(found))
            yield from found

    paths = StringArray(names())
    empty = [c for c, n in zip(classes, counts) if n == 0]
    if empty and not allow_empty:
        raise FileNotFoundError(f"ImageFolder: found no image files (extensions {', '.join(extensions)}) for the "
                                f"classes {empty[:10]} under {root!r}; pass allow_empty=True to keep empty classes")
    return paths, np.repeat(np.arange(len(classes), dtype=np.int64), counts)


class ImageFolder:
    """Images in ``root/<class>/<file>`` (files may also sit in subfolders of a class
    folder); samples are ``(image, label)``.

    * ``classes`` (sorted folder names) and ``class_to_idx``, as in torchvision.
    * ``transform`` receives the opened PIL image, not yet decoded, so that transforms
      such as :class:`shmload.transforms.RandomResizedCrop` can decode it at a reduced
      size; without a transform the image is the decoded RGB ``uint8`` array ``[H, W, 3]``.
    * ``target_transform`` receives the label.
    * ``loader``: a function ``path -> image`` replacing Pillow's lazy open.
    * ``on_error="raise"``: an unreadable image raises :class:`shmload.ImageDecodeError`
      naming the file and the index. ``"skip"``: a warning naming the file, and the next
      readable file in the list (index + 1, + 2, ...) takes its place, so a run stays
      reproducible.
    * ``targets``: every sample's label, an ``int64`` array; :meth:`path` gives a file's path.
    """

    decodes_images = True  # what the profiler reads to name the stage (profiler/stats.py)

    def __init__(self, root: str | os.PathLike, transform: Callable | None = None,
                 target_transform: Callable | None = None, extensions: Sequence[str] = IMG_EXTENSIONS,
                 on_error: str = "raise", loader: Callable[[str], Any] | None = None,
                 allow_empty: bool = False):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"ImageFolder: on_error must be 'raise' or 'skip', got {on_error!r}")
        if isinstance(extensions, str):
            extensions = (extensions,)
        self.root = os.fspath(root)
        self.extensions = tuple(e.lower() for e in extensions)
        self.transform, self.target_transform, self.loader = transform, target_transform, loader
        self.on_error = on_error
        self.classes = find_classes(self.root)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._paths, self.targets = scan(self.root, self.classes, self.extensions, allow_empty)

    def __len__(self) -> int:
        return len(self.targets)

    def path(self, index: int) -> str:
        """The file of sample ``index``."""
        return os.path.join(self.root, self._paths[index])

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        n = len(self)
        index = operator.index(index)
        if not -n <= index < n:
            raise IndexError(f"ImageFolder index {index} is out of range for {n} images")
        index %= n
        errors = _decode_errors()
        for _ in range(MAX_SKIPS):
            try:
                image = self._image(index)
                break
            except errors as exc:
                err = ImageDecodeError(f"cannot read image file {self.path(index)!r} (dataset index {index}, class "
                                       f"{self.classes[self.targets[index]]!r}): {type(exc).__name__}: {exc}")
                if self.on_error == "raise":
                    raise err from exc
                warnings.warn(f"{err}; skipped, dataset index {(index + 1) % n} takes its place "
                              "(ImageFolder on_error='skip')", ShmloadWarning, stacklevel=2)
                index = (index + 1) % n
        else:
            raise ImageDecodeError(f"ImageFolder: {MAX_SKIPS} image files in a row could not be read, the last "
                                   f"{self.path((index - 1) % n)!r}; is the folder corrupt?")
        target = int(self.targets[index])
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def _image(self, index: int) -> Any:
        path = self.path(index)
        if self.loader is not None:
            img = self.loader(path)
            return img if self.transform is None else self.transform(img)
        from PIL import Image

        img = Image.open(path)  # reads the header only: a transform may still choose the decoded size
        out = None
        try:
            if self.transform is None:
                return np.asarray(img if img.mode == "RGB" else img.convert("RGB"))
            out = self.transform(img)
            if out is img:
                img.load()  # returned as it is: decode now, while the file is open
            return out
        finally:
            if out is not img:
                img.close()
