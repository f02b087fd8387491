"""Errors meant for people: each says what is wrong and how to fix it."""


class FedhetError(Exception):
    """Base class of every error fedhet reports to a user (the CLI prints it on one line, exit code 2)."""


class ConfigError(FedhetError):
    """A configuration value is unknown, of the wrong type or out of range."""


class DataError(FedhetError):
    """A dataset file is missing or corrupt, or a partition is impossible."""


class DivergenceError(FedhetError):
    """Training produced a NaN or exploding loss."""


class FedhetWarning(UserWarning):
    """Something the user should know that does not stop the run (the CLI prints it on one line)."""


class FedhetNote(FedhetWarning):
    """What fedhet did on its own that the user should hear about (a column dropped as an id, rows with empty cells
    dropped, the natural split a user column implies); the CLI prints it as a ``note:`` line."""
