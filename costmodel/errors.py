"""The one exception type that user-facing commands turn into a one-line error."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input: the message names the field and the allowed values, on one line."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


def choice(field: str, value: object, allowed: tuple[str, ...] | list[str]) -> str:
    """Return ``value`` lower-cased if it is one of ``allowed``, else raise ``ConfigError``."""
    key = str(value).strip().lower()
    if key not in allowed:
        raise ConfigError(field, f"unknown value {value!r}; allowed: {', '.join(allowed)}")
    return key
