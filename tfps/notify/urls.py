"""Where notification URLs come from: ``--notify`` values, ``APPRISE_URLS`` and the file
that ``APPRISE_URLS_FILE`` names.

Kept apart from the Notifier so that launchers (``tfps local``, ``tfps notify-failure``)
can gather the URLs and hand them to a task through its environment, never on a
command line. Containers receive them as a file (a compose secret, or a file the Ansible
role writes with mode 0400): ``docker inspect`` shows a container's environment, and the
file keeps the URLs out of it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

# ENV_URLS_FILE names a file of URLs (spaces, commas or lines between them), which a task
# container finds at URLS_FILE_MOUNT: the plan carries both (compose and the role use them).
from tfps.cluster.plan import ENV_URLS_FILE, URLS_FILE_MOUNT  # noqa: F401
from tfps.errors import ConfigError

#: Environment variable with URLs separated by spaces or commas (as for apprise's CLI).
ENV_URLS = "APPRISE_URLS"

# A comma separates two URLs only when the next one starts right after it.
_URL_SEPARATOR = re.compile(r"\s+|,\s*(?=[A-Za-z][A-Za-z0-9+.\-]*://)")


def _split_urls(value: str) -> list[str]:
    return [u.strip(",") for u in _URL_SEPARATOR.split(value or "") if u.strip(",")]


def read_urls_file(path: str) -> str:
    """The URLs of the file ``path``, lines starting with ``#`` left out."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
        raise ConfigError(f"cannot read {path} ({why}); it must be a text file of apprise URLs that the task's "
                          "user can read (in a container: owned by uid 10001, mode 0400)", ENV_URLS_FILE) from None
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def collect_urls(cli_urls: Sequence[str] | None, environ: Mapping[str, str] = os.environ) -> list[str]:
    """All notification URLs: ``--notify`` values first, then ``APPRISE_URLS``, then the
    file ``APPRISE_URLS_FILE`` names.

    Each may hold several URLs separated by spaces, commas or lines; a comma inside a URL
    (such as ``?to=a@example.com,b@example.com``) stays part of it. Duplicates are dropped.
    Values that are not URLs are kept, so that :class:`Notifier` can refuse them.
    """
    values = list(cli_urls or []) + [environ.get(ENV_URLS, "")]
    if environ.get(ENV_URLS_FILE, "").strip():
        values.append(read_urls_file(environ[ENV_URLS_FILE].strip()))
    urls: list[str] = []
    for value in values:
        for url in _split_urls(value):
            if url not in urls:
                urls.append(url)
    return urls
