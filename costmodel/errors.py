"""The exception types that user-facing commands turn into a one-line error: what the user wrote
(:class:`ConfigError`, exit 2) apart from what the cluster did (:class:`JobError`, exit 1)."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input: the message names the field and the allowed values, on one line."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class JobError(ConfigError):
    """The cluster failed a job, not the user's input: a rank died or stopped, ranks disagree on what
    they were handed, a launcher could not start them, a job ended without finishing. One line, exit 1;
    a tuning run still writes what its measurements support."""


def choice(field: str, value: object, allowed: tuple[str, ...] | list[str]) -> str:
    """Return ``value`` lower-cased if it is one of ``allowed``, else raise ``ConfigError``."""
    key = str(value).strip().lower()
    if key not in allowed:
        raise ConfigError(field, f"unknown value {value!r}; allowed: {', '.join(allowed)}")
    return key
