"""Errors a user can fix. The CLI prints their message and exits with code 2, no traceback."""


class UserError(Exception):
    """Bad input, configuration or workspace state; the message says what and what to do."""


class ConfigError(UserError):
    """An unknown key, a wrong type or an invalid value in a stage's configuration."""
