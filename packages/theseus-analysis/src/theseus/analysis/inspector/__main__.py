"""``python -m theseus.analysis.inspector show|diff ...``."""

from .cli import inspect

if __name__ == "__main__":
    inspect(prog_name="python -m theseus.analysis.inspector")
