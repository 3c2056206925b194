"""Argument checks shared by the loader and the samplers: one message format for all."""

from __future__ import annotations

import numbers
from typing import Any


def check_int(name: str, value: Any, minimum: int, allow_none: bool = False, also: str = "") -> None:
    """Raise ValueError unless ``value`` is an integer >= ``minimum`` (or None if allowed);
    ``also``: words the message ends with, in brackets."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        expected = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
        raise ValueError(f"{name} should be {expected}{' or None' if allow_none else ''}, but got {name}={value!r}"
                         + (f" ({also})" if also else ""))
