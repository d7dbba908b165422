"""Keeping notification secrets out of sight: masked URLs and scrubbed log lines.

Notification URLs hold passwords and tokens. A URL is only ever shown masked
(:func:`mask_url`), and apprise's own log records are scrubbed of every secret of the
configured services (``SCRUBBER``), because apprise's secure logging only shortens a
secret to its first and last character. Also here: the checks that refuse a URL which
apprise would misread (an unencoded ``@``, ``/`` or ``%`` in a password).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Iterable, Iterator
from urllib.parse import quote, unquote

import apprise

MASK = "****"

URL_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://(?P<rest>[^?#]*)(?P<query>\?[^#]*)?(?P<frag>#.*)?$",
                     re.DOTALL)
_HOSTLIKE = re.compile(r"^(localhost|[\w-]+(\.[\w-]+)+|\[[0-9A-Fa-f:.]+\])(:\d+)?$")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_TOKEN_SPLIT = re.compile(r"[/:@?&=,;#+\s]+")
#: Shorter fragments are not scrubbed from apprise's log lines (they would mangle them).
MIN_SECRET_LEN = 3


def regex_mask(url: str) -> str:
    """Mask a URL that apprise cannot parse: keep the scheme and host, hide the rest."""
    m = URL_RE.match(url.strip())
    if not m:
        return MASK  # not a URL at all; it might be a pasted token
    rest = m["rest"]
    userinfo = ""
    if "@" in rest:  # the last '@' ends the user info, even if a password holds a '/'
        rest = rest.rsplit("@", 1)[1]
        userinfo = MASK + "@"
    host, _, path = rest.partition("/")
    if not _HOSTLIKE.match(host):  # some services put an ID or token where a host would be
        host = MASK
    masked = f"{m['scheme']}://{userinfo}{host}"
    if path:
        masked += "/" + "/".join(MASK if seg else "" for seg in path.split("/"))
    if m["query"]:
        pairs = [p for p in re.split(r"[&;]", m["query"][1:]) if p]
        masked += "?" + "&".join(f"{p.split('=', 1)[0]}={MASK}" if "=" in p else MASK for p in pairs)
    if m["frag"]:
        masked += "#" + MASK
    return masked


def short(privacy_url: str) -> str:
    """apprise's privacy rendering without the query: options, and noise in a log line."""
    return privacy_url.split("?", 1)[0]


@contextlib.contextmanager
def apprise_held() -> Iterator[list[logging.LogRecord]]:
    """Hold back the log records apprise emits in this thread while it parses a URL.

    While parsing, apprise may quote a URL it could not mask (an unknown scheme, a
    mangled password). The records are kept for counting, never emitted.
    """
    me = threading.get_ident()
    held: list[logging.LogRecord] = []

    class _Hold(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.thread != me:
                return True
            held.append(record)
            return False

    logger = logging.getLogger("apprise")
    hold = _Hold()
    logger.addFilter(hold)
    try:
        yield held
    finally:
        logger.removeFilter(hold)


def instantiate(url: str, asset: apprise.AppriseAsset | None = None):
    """apprise's plugin for ``url`` (what ``Apprise.add`` would keep), or None."""
    with apprise_held():
        try:
            return apprise.Apprise.instantiate(url, asset=asset or apprise.AppriseAsset(storage_mode="memory"))
        except Exception:  # noqa: BLE001 - a plugin that raises is a URL it cannot use
            return None


def misread(url: str, m: re.Match) -> str | None:
    """Why apprise would misread ``url`` (a password that is not percent-encoded), or None."""
    if _BAD_PERCENT.search(url):
        return "it holds a '%' that starts no %XX escape"
    if m["rest"].split("/", 1)[0].count("@") > 1:
        return "it holds more than one '@' before the host"
    return None


def known_scheme(scheme: str) -> bool:
    try:
        return scheme in apprise.apprise.N_MGR  # the plugin registry Apprise.add consults
    except Exception:  # noqa: BLE001 - registry moved: let instantiate() decide
        return True


def hostless(m: re.Match, plugin) -> bool:
    """apprise found no host where the URL has user info: an '@' or '/' in the password."""
    return "@" in m["rest"] and getattr(plugin, "host", None) == ""


def mask_url(url: str) -> str:
    """The URL as it may be shown: no password, token or other secret.

    apprise's privacy rendering (``plugin.url(privacy=True)``) when apprise understands
    the URL, without the query string; otherwise (or when apprise would misread it) the
    scheme and host only, with the user info, every path segment and every query value
    replaced by ``****``.
    """
    url = (url or "").strip()
    m = URL_RE.match(url)
    if m is None or misread(url, m):
        return regex_mask(url)
    plugin = instantiate(url)
    if plugin is not None and not hostless(m, plugin):
        try:
            return short(plugin.url(privacy=True))
        except Exception:  # noqa: BLE001
            pass
    return regex_mask(url)


def secrets_of(plugin) -> set[str]:
    """What must never be shown of a service: every part of its URL that apprise masks.

    apprise renders a URL twice, as is and with ``privacy=True``; the two renderings
    have the same shape, so the parts that differ are exactly the secrets.
    """
    secrets: set[str] = set()
    try:
        plain = [t for t in _TOKEN_SPLIT.split(plugin.url(privacy=False)) if t]
        shown = [t for t in _TOKEN_SPLIT.split(plugin.url(privacy=True)) if t]
    except Exception:  # noqa: BLE001
        plain, shown = [], []
    if len(plain) == len(shown):
        secrets.update(p for p, s in zip(plain, shown) if p != s)
    else:  # masking changed the shape: everything not shown as is
        secrets.update(set(plain) - set(shown))
    password = getattr(plugin, "password", None)
    if isinstance(password, str):
        secrets.add(password)
    secrets |= {unquote(s) for s in secrets} | {quote(s, safe="") for s in secrets}
    return {s for s in secrets if len(s) >= MIN_SECRET_LEN}


class _Scrubber(logging.Filter):
    """Replaces known secrets in log records and texts with ``****``.

    Installed once on apprise's logger: its secure logging shortens secrets to their
    first and last character, which is not good enough for a log that is shipped around.
    """

    def __init__(self):
        super().__init__()
        self._secrets: tuple[str, ...] = ()
        self._lock = threading.Lock()

    def add(self, secrets: Iterable[str]) -> None:
        with self._lock:
            merged = set(self._secrets) | {s for s in secrets if s}
            self._secrets = tuple(sorted(merged, key=len, reverse=True))  # longest first

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if self._secrets:
            try:
                message = record.getMessage()
            except Exception:  # noqa: BLE001 - a broken record is the logging module's problem
                return True
            clean = self.scrub(message)
            if clean != message:
                record.msg, record.args = clean, None
        return True


SCRUBBER = _Scrubber()


def install_scrubber() -> None:
    logger = logging.getLogger("apprise")
    if SCRUBBER not in logger.filters:
        logger.addFilter(SCRUBBER)

