"""The foundations import without JAX, so `theseus --help` and `theseus jobs PREFIX` start fast."""

from __future__ import annotations

import subprocess
import sys


def test_foundation_modules_do_not_import_jax() -> None:
    code = (
        "import sys\n"
        "import theseus.config, theseus.registry, theseus.job, theseus.quick, theseus.cli\n"
        "heavy = sorted(m for m in ('jax', 'flax', 'optax', 'orbax') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
