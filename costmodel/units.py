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


def format_time_us(time_us: float) -> str:
    """A duration for people, from microseconds: ``8.41 us``, ``812 us``, ``43.2 ms``, ``2.35 s``
    (three significant digits; the unit keeps the number between 1 and 1000)."""
    t = float(time_us)
    if t != t or t in (float("inf"), float("-inf")):
        return f"{t} us"
    for unit, scale in (("us", 1.0), ("ms", 1e3), ("s", 1e6)):
        v = t / scale
        if abs(v) < 999.5 or unit == "s":
            if abs(v) >= 1000:
                return f"{v:.0f} {unit}"
            return f"{v:.3g} {unit}" if abs(v) >= 1 or v == 0 else f"{v:.2g} {unit}"
    raise AssertionError("unreachable")


def format_bytes(nbytes: int) -> str:
    """A size for people: ``8 B``, ``64 KiB``, ``1.5 MiB``, ``4 GiB``."""
    n = int(nbytes)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{n} B"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 node``, ``2 nodes``; ``many`` for irregular plurals."""
    return f"{n} {word if n == 1 else (many or word + 's')}"
