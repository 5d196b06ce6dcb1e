"""Exceptions the library raises for bad input, so callers can report them in one line."""


class DreamShardError(Exception):
    """Base class: an error whose message is meant for the user as it is."""


class DataFormatError(DreamShardError, ValueError):
    """A data file (dataset, tables, tasks, plan) does not have the expected content."""


class InvalidPlanError(DreamShardError, ValueError):
    """A plan breaks a rule: a table placed twice or not at all, memory exceeded, ..."""


class InfeasibleTaskError(DreamShardError):
    """No placement of the task's tables respects the devices' memory."""


class OverBudgetError(DreamShardError):
    """A backend was asked to hold more bytes in one operator than it may (nothing was allocated)."""

    def __init__(self, message: str, needed_bytes: int, budget_bytes: int) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.budget_bytes = budget_bytes
