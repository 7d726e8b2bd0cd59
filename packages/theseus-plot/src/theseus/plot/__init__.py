"""theseus.plot: opinionated figures with seaborn's signatures, returned as Figures.

``heatmap``, ``bar``, ``line`` and ``scatter`` take exactly the parameters of
their seaborn counterparts plus keyword-only ``title``, ``xlabel``, ``ylabel``
and ``figsize``, draw on a new themed Figure (never pyplot's) and return it.
``to_pdf``/``to_png``/``save`` export it byte-for-byte reproducibly. This
package never imports JAX; JAX arrays are accepted through ``__array__``.
"""

from theseus.plot._bar import bar
from theseus.plot._errors import PlotError, PlotTypeError, PlotValueError
from theseus.plot._export import FORMATS, save, to_pdf, to_png
from theseus.plot._heatmap import heatmap
from theseus.plot._mixin import Plotting
from theseus.plot._relational import line, scatter
from theseus.plot._theme import PALETTE, SERIF_FONTS, apply_theme, theme, theme_rc

__all__ = [
    "FORMATS",
    "PALETTE",
    "SERIF_FONTS",
    "PlotError",
    "PlotTypeError",
    "PlotValueError",
    "Plotting",
    "apply_theme",
    "bar",
    "heatmap",
    "line",
    "save",
    "scatter",
    "theme",
    "theme_rc",
    "to_pdf",
    "to_png",
]
