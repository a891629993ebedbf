"""One error type for bad input: the CLI turns it into one line and exit code 2."""

from __future__ import annotations


def shorten(text: str, limit: int) -> str:
    """`text`, or its first `limit - 1` characters and an ellipsis: echoed input stays readable. The one
    cutter for every echoed value and error line (configs, traces, the CLI's line cap)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class InputError(Exception):
    """Bad input a user can fix: names the file (or option), the field and the reason.

    Models raise it; only the CLI prints it. `str(err)` is the one line the user sees.
    """

    def __init__(self, reason: str, *, source: str | None = None, field: str | None = None):
        self.reason = reason
        self.source = source
        self.field = field
        parts = []
        if source:
            parts.append(shorten(str(source), 120))  # a path or option value can be any length
        if field:
            parts.append(f"field '{shorten(str(field), 60)}'")
        prefix = ": ".join(parts)
        super().__init__(f"{prefix}: {reason}" if prefix else reason)


class DoesNotFit(InputError):
    """A plan that is well-formed but does not fit in the hardware (still exit code 2)."""
