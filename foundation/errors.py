"""The root of fleetrl's own errors: `except FleetrlError` catches every one of them.

    try:
        config.validate()
    except FleetrlError as err:          # ConfigError, CheckpointError, WireError, ...
        print(err, err.field)            # the message names the value and the limit

Each precise type keeps the builtin base its callers already catch (ConfigError is still a
ValueError, IngestUnavailable still a ConnectionError). The CLI catches the root alone, prints
`fleetrl <subcommand>: error: <message>` and exits with the error's `exit_status`: 2 for input
it cannot use (a user's mistake), 1 for a run that failed. The message says what is wrong on its
own (the field, the value, the limit); no label goes before it.
"""

from __future__ import annotations


class FleetrlError(Exception):
    """An error fleetrl raises on purpose; `field` names the offending field when there is one."""

    field: str | None = None  # a config field, tensor or message field; None when no one field is at fault
    exit_status = 2  # the CLI's exit status: 2 = input it cannot use (config, file, argument)

    def __init__(self, *args: object, field: str | None = None) -> None:
        super().__init__(*args)
        if field is not None:
            self.field = field


class RunFailed(FleetrlError):
    """Base of the errors that end a run that had started (exit status 1), not bad input."""

    exit_status = 1
