"""Sizes as users write them (``8``, ``64K``, ``1M``, ``4GiB``), parsed the same way by every command."""

from __future__ import annotations

import re
from fractions import Fraction

from ncclrl.costmodel.errors import ConfigError

_SUFFIX = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
           "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40}


def parse_bytes(text: str, field: str = "nbytes") -> int:
    """``8``, ``64K``, ``1M``, ``4GiB`` -> bytes; zero, negative or fractional sizes are errors."""
    m = re.fullmatch(r"\s*([+-]?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _SUFFIX:
        raise ConfigError(field, f"not a size: {text!r}; use a whole number of bytes with an optional "
                          "K, M or G suffix")
    value = Fraction(m.group(1)) * _SUFFIX[m.group(2).lower()]  # exact: no rounding past 2^53, as a float would
    if value.denominator != 1:
        raise ConfigError(field, f"must be a whole number of bytes, got {text!r}")
    if value <= 0:
        raise ConfigError(field, f"must be > 0, got {text!r}")
    return int(value)
