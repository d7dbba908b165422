"""``python -m tfps``: the ``tfps`` command, for launchers that start tasks with the same interpreter."""

import sys

from tfps.cli import main

sys.exit(main())
