"""Published files get the mode open() would give them, and writing one never touches the umask.

orbax's save threads create files while the publisher writes; a umask flipped for an
instant, even to read it, would give their files mode 0666 (world-writable).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import os, stat, sys
    from pathlib import Path

    os.umask(0o027)
    from theseus.analysis._publish import write_atomic

    calls = []
    real = os.umask
    def spy(mask):
        calls.append(mask)
        return real(mask)
    os.umask = spy

    target = Path(sys.argv[1]) / "figure.pdf"
    write_atomic(target, b"%PDF-1.4")
    reference = Path(sys.argv[1]) / "reference.txt"
    reference.write_bytes(b"made by open()")
    print(oct(stat.S_IMODE(target.stat().st_mode)), oct(stat.S_IMODE(reference.stat().st_mode)), calls)
    """
)


def test_a_published_file_has_open_s_mode_and_the_umask_is_never_changed(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, check=True
    )
    mode, reference, calls = done.stdout.split(maxsplit=2)
    assert reference == "0o640"  # the umask 027 applied by open() itself
    assert mode == reference
    assert calls.strip() == "[]"
