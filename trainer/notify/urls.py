"""Where notification URLs come from: ``--notify`` values and ``APPRISE_URLS``.

Kept apart from the Notifier so that launchers (``tfps local``, ``tfps notify-failure``)
can gather the URLs and hand them to a task through its environment, never on a
command line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

#: Environment variable with URLs separated by spaces or commas (as for apprise's CLI).
ENV_URLS = "APPRISE_URLS"

# A comma separates two URLs only when the next one starts right after it.
_URL_SEPARATOR = re.compile(r"\s+|,\s*(?=[A-Za-z][A-Za-z0-9+.\-]*://)")


def _split_urls(value: str) -> list[str]:
    return [u.strip(",") for u in _URL_SEPARATOR.split(value or "") if u.strip(",")]


def collect_urls(cli_urls: Sequence[str] | None, environ: Mapping[str, str] = os.environ) -> list[str]:
    """All notification URLs: ``--notify`` values first, then ``APPRISE_URLS``.

    Both may hold several URLs separated by spaces or commas; a comma inside a URL (such
    as ``?to=a@example.com,b@example.com``) stays part of it. Duplicates are dropped.
    Values that are not URLs are kept, so that :class:`Notifier` can refuse them.
    """
    urls: list[str] = []
    for value in list(cli_urls or []) + [environ.get(ENV_URLS, "")]:
        for url in _split_urls(value):
            if url not in urls:
                urls.append(url)
    return urls

