"""Looking at recordings: `from theseus.analysis import inspector, magnifier`.

The forward recorder's documentation imports `inspector` and `magnifier` side by side;
this module is that second name. It holds the viewers of the `[inspect]` extra.
"""

from theseus.analysis.inspector import magnify, read_from_safetensors

__all__ = ["magnify", "read_from_safetensors"]
