"""`TheseusError`: the root of every error theseus-core and theseus-analysis raise on purpose.

Each error class also derives from the built-in exception it refines (`ValueError`,
`KeyError`, `FileNotFoundError`, ...), so existing `except ValueError` code keeps
working, while `except TheseusError` catches Theseus's own errors and nothing else:
a bug in user code (an `AttributeError` in `select()`, say) is never mistaken for one.

theseus-store and theseus-plot install without theseus-core and keep their own roots
(`theseus.store.StoreError`, `theseus.plot.PlotError`).

Example:
    >>> from theseus.config import ConfigError
    >>> from theseus.errors import TheseusError
    >>> issubclass(ConfigError, TheseusError) and issubclass(ConfigError, ValueError)
    True
"""

__all__ = ["TheseusError"]


class TheseusError(Exception):
    """An input or state Theseus cannot work with; the message says what was expected,
    what arrived, and how to fix it."""
