"""``python -m trainer``: the ``tfps`` command, for launchers that start tasks with the same interpreter."""

import sys

from trainer.cli import main

sys.exit(main())
