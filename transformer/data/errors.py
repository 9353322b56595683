"""The one error the data pipeline raises for input it cannot use."""


class DataError(ValueError):
    """A dataset cannot be read; the one-line message says how to provide it."""
