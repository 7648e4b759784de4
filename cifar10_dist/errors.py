"""The one exception type for mistakes a user can fix (bad flags, missing data, ...)."""


class UserError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""
