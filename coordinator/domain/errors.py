"""Errors of the pure core."""


class Rejected(Exception):
    """A command is invalid against the current state; ``str(exc)`` is the reason for a person."""
