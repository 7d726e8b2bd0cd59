"""``python -m benchmarks``: run every benchmark and write one table (see ``run.py``)."""

import sys

from benchmarks.run import main

sys.exit(main())
