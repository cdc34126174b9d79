"""The one exception the config package raises."""


class ConfigError(Exception):
    """A configuration that cannot be used; the message names the source and field."""
