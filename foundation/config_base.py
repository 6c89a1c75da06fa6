"""What every config section is built from: a field with a help line, the check a section
reports, the error a bad value raises, and the helpers its messages use.

    @dataclass(frozen=True)
    class SomeConfig:
        size: int = config_field(4, "what it sizes, and in what unit")

        def checks(self) -> list[Check]:
            return [(self.size >= 1, "size", ">= 1")]   # RunConfig.validate runs them at launch
"""

from __future__ import annotations

import difflib
from dataclasses import field
from typing import Any

from foundation.errors import FleetrlError


def config_field(default: Any, help: str) -> Any:
    """A dataclass field with a help line; tuples and other immutables only."""
    return field(default=default, metadata={"help": help})


class ConfigError(FleetrlError, ValueError):
    """A configuration value is out of range; the message names the field and the limit."""


Check = tuple[bool, str, str]  # a section's check: (it passed, the field it names, the limit a message gives)


def one_of(names: tuple[str, ...]) -> str:
    """'a', 'b', 'c': the names as a message lists them."""
    return ", ".join(repr(name) for name in names)


def suggest(value: str, choices: Any) -> str:
    """'; did you mean X? valid: A, B, C' for a value outside `choices`."""
    names = sorted(choices)
    close = difflib.get_close_matches(value, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} valid: {', '.join(names)}"
