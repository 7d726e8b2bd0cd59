"""``Plotting``: the helpers as methods, for classes such as analyses to inherit.

``self.heatmap(values, xlabel="Feature", ylabel="Token")`` inside a subclass
calls :func:`theseus.plot.heatmap` itself: the attributes are the module
functions wrapped in ``staticmethod``, so they have exactly the functions'
signatures and behaviour and hold no per-instance state.
"""

from __future__ import annotations

from theseus.plot._bar import bar
from theseus.plot._heatmap import heatmap
from theseus.plot._relational import line, scatter


class Plotting:
    """Mixin exposing :func:`heatmap`, :func:`bar`, :func:`line`, :func:`scatter` as methods.

    Example:
        >>> import numpy as np
        >>> class Analysis(Plotting):
        ...     def plot(self, values):
        ...         return self.heatmap(values, xlabel="Feature", ylabel="Token")
        >>> Analysis().plot(np.ones((2, 3))).axes[0].get_ylabel()
        'Token'
    """

    heatmap = staticmethod(heatmap)
    bar = staticmethod(bar)
    line = staticmethod(line)
    scatter = staticmethod(scatter)
