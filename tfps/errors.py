"""Errors a user can fix. Each one says what is wrong and what to change."""

from __future__ import annotations


class ConfigError(Exception):
    """Bad input: an inventory, a flag, TF_CONFIG, data files, a model name, a URL.

    The message names the field and tells the user what to change. The CLI prints it
    on one line and exits with ``ExitCode.BAD_CONFIG`` before anything is started.
    """

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        self.message = message  #: without the field: for callers that re-word the error
        super().__init__(f"{field}: {message}" if field else message)
