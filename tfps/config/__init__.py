"""Run options shared by ``tfps run`` and ``tfps local``, and their validation.

``schema``: ``RunConfig``, the bounds of its fields and their checks; ``args``: the argparse
definition and its one-line errors; ``jobfile``: ``--config`` YAML job files. Every name is
imported from here (``from tfps.config import RunConfig``).
"""

from tfps.config.args import *  # noqa: F401,F403
from tfps.config.args import _UNDERSCORED  # noqa: F401
from tfps.config.durations import parse_every  # noqa: F401
from tfps.config.jobfile import *  # noqa: F401,F403
from tfps.config.schema import *  # noqa: F401,F403
