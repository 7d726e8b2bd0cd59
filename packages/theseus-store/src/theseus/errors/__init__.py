"""`TheseusError`: the one root of every error the four Theseus packages raise on purpose.

It lives in theseus-store because that is the lowest package: it needs nothing but the
standard library, and theseus-core and theseus-analysis depend on it, so the class is
defined once and `from theseus.errors import TheseusError` works wherever core is
installed. theseus-plot does not depend on the store: when the store is installed beside
it, `PlotError` derives from this class; installed alone, plot defines a stand-in of the
same name (there is then no other Theseus error to share a root with).

Each error class also derives from the built-in exception it refines (`ValueError`,
`KeyError`, `FileNotFoundError`, `RuntimeError`, ...), so existing `except ValueError`
code keeps working, while `except TheseusError` catches Theseus's own errors and nothing
else: a bug in user code (an `AttributeError` in `select()`, say) is never mistaken for one.

Example:
    >>> from theseus.errors import TheseusError
    >>> from theseus.store import StoreError
    >>> issubclass(StoreError, TheseusError) and issubclass(StoreError, RuntimeError)
    True
"""

__all__ = ["TheseusError"]


class TheseusError(Exception):
    """An input or state Theseus cannot work with; the message says what was expected,
    what arrived, and how to fix it."""
