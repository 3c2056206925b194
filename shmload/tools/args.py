"""Argument types the sub-commands share (a module of its own: cli.py imports the
sub-commands, which must not import it back)."""

from __future__ import annotations

import argparse
from typing import Callable


def counted(minimum: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum`` (``what`` names it)."""

    def parse(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}: a whole number of at least {minimum}, got {text!r}")
        return value

    return parse
