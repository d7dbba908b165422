"""The completion message: one email or chat message when a job ends, sent through apprise.

Only the chief sends, exactly once per job: ``succeeded``, ``failed`` or ``stopped``
(and ``started`` when asked for). The message names the job, its hosts and tasks, when
it started and ended, the global step, final loss and metrics, where the checkpoint and
the export are, and for a failure the error and the last lines of its traceback. The
subject alone tells success from failure::

    [tfps] ✔ job demo succeeded at step 400
    [tfps] ✘ job demo FAILED at step 120: loss is nan at global step 120
    [tfps] job demo stopped at step 200

apprise sends everything (email, chat, webhooks): there is no SMTP or HTTP code here.
The loss plot (PNG) and results.json go along as attachments where the service takes
them (email and ``json://`` do; chat services without attachments get the text).

Where the URLs come from
------------------------
All of these are used together (a URL given twice is used once):

* ``APPRISE_URLS``: one or more URLs separated by spaces or commas (the variable apprise's
  own CLI reads). The way to keep URLs out of command lines and files.
* ``--notify URL``, repeatable.
* ``--notify_config FILE``: an apprise configuration file, YAML or text, e.g.::

      urls:
        - mailtos://alice:s3cr%40t@smtp.example.com?to=ml-team@example.com:
            tag: succeeded, stopped
        - json://pager.example.com/hooks/training:
            tag: failed
        - ntfys://ntfy.example.com/training          # no tag: every event

  The YAML ``template:`` section works too: ``${NAME}`` placeholders are filled from
  ``APPRISE_TEMPLATE_<NAME>`` environment variables, so the file holds no secret.

Which service gets which event (tags)
-------------------------------------
* A service without tags receives every event (URLs from ``APPRISE_URLS`` and
  ``--notify`` have no tags).
* A tagged service receives the events named by its tags (``started``, ``succeeded``,
  ``failed``, ``stopped``) and, if tagged ``always``, every event.
* A service whose tags name none of these receives nothing (a warning says so).
* ``tfps notify-test`` sends its test message to every service, whatever the tags.

apprise's own tag filter cannot express the first rule: in apprise 2.3.0,
``notify(tag="failed")`` reaches services tagged ``failed`` or ``always`` but never an
untagged one, and only ``tag="all"`` (the default) reaches untagged services, together with
every tagged one. So the Notifier picks the services itself and hands apprise exactly
those.

Passwords and tokens
--------------------
A URL is parsed like any URL, so special characters in a user name or password must be
percent-encoded: ``@`` as ``%40``, ``%`` as ``%25``, ``;`` as ``%3B``, ``/`` as ``%2F``,
``:`` as ``%3A``, ``#`` as ``%23``, ``?`` as ``%3F``, ``&`` as ``%26``, a space as ``%20``.
Checked against a real SMTP server with apprise 2.3.0, the password ``p@ss%w;rd/1`` arrives
intact written either way::

    mailto://ops:p%40ss%25w%3Brd%2F1@smtp.example.com?to=ops@example.com
    mailto://smtp.example.com?user=ops&pass=p%40ss%25w%3Brd%2F1&to=ops@example.com

Unencoded, it does not: in the user:password part an ``@`` or ``/`` makes apprise take a
piece of the password for the host, or find no host at all, and in ``?pass=`` a ``;``
separates parameters like ``&``, so the password is cut short. tfps refuses such URLs before the
job starts (``ConfigError``, field ``notify``) where it can tell: a ``%`` that starts no
``%XX`` escape, more than one ``@`` before the host, or a URL in which apprise finds no
host. In a config file, ``${NAME}`` template values may be given raw or percent-encoded:
both spellings of the password above arrive intact.

URLs are shown only masked (:func:`mask_url`): apprise's privacy rendering for URLs it
understands (passwords and tokens become ``****``), and for others the scheme and host
only. Logs, :class:`Delivery` records, errors and messages never carry the secrets, and
apprise's own log lines are scrubbed of the configured secrets as well.

Never in the way of training
----------------------------
* Every send has a budget (``timeout``, 15 s): apprise stops waiting after it
  (``notify(timeout=...)``) and every service's connect and read timeouts (``cto``,
  ``rto``; for email the SMTP timeout) are capped to fit it, so no socket stays open
  for long after the budget either.
* A failed delivery is retried once (``attempts=2``), never more, even if a URL asks for
  ``retry=5``. (apprise spaces two emails to one server by 5 s, so an email retry comes
  about 5 s after the first try; it still fits the budget.)
* Every outcome is logged (logger ``tfps.notify``); :meth:`Notifier.send` never raises
  and the caller's exit code does not depend on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import os
import re
import socket
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TextIO
from urllib.parse import quote, unquote

import apprise

from trainer.errors import ConfigError

log = logging.getLogger("tfps.notify")

#: The events a job can report. ``started`` is sent only when asked for.
EVENTS = ("started", "succeeded", "failed", "stopped")
#: A service tagged ``always`` receives every event (apprise's own name for this tag).
ALWAYS = apprise.common.MATCH_ALWAYS_TAG
#: Environment variable with URLs separated by spaces or commas (as for apprise's CLI).
ENV_URLS = "APPRISE_URLS"
DEFAULT_TIMEOUT = 15.0
DEFAULT_ATTEMPTS = 2
#: One retry at most: a message that two attempts could not deliver is not worth a
#: longer wait at the end of a job.
MAX_ATTEMPTS = 2

NOTIFY_TYPES = {
    "started": apprise.NotifyType.INFO,
    "succeeded": apprise.NotifyType.SUCCESS,
    "failed": apprise.NotifyType.FAILURE,
    "stopped": apprise.NotifyType.WARNING,
}

ENCODING_HINT = (
    "percent-encode special characters in user names, passwords and tokens: "
    "@ as %40, % as %25, ; as %3B, / as %2F, : as %3A, # as %23, ? as %3F, & as %26"
)
URL_HELP = "https://github.com/caronc/apprise/wiki"
TRACEBACK_LINES = 30
TRACEBACK_CHARS = 4000
MASK = "****"


# --------------------------------------------------------------------------------------
# Secrets: masking URLs, keeping them out of apprise's log lines
# --------------------------------------------------------------------------------------

_URL_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://(?P<rest>[^?#]*)(?P<query>\?[^#]*)?(?P<frag>#.*)?$",
                     re.DOTALL)
_HOSTLIKE = re.compile(r"^(localhost|[\w-]+(\.[\w-]+)+|\[[0-9A-Fa-f:.]+\])(:\d+)?$")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_TOKEN_SPLIT = re.compile(r"[/:@?&=,;#+\s]+")
#: Shorter fragments are not scrubbed from apprise's log lines (they would mangle them).
MIN_SECRET_LEN = 3


def _regex_mask(url: str) -> str:
    """Mask a URL that apprise cannot parse: keep the scheme and host, hide the rest."""
    m = _URL_RE.match(url.strip())
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


def _short(privacy_url: str) -> str:
    """apprise's privacy rendering without the query: options, and noise in a log line."""
    return privacy_url.split("?", 1)[0]


@contextlib.contextmanager
def _apprise_held() -> Iterator[list[logging.LogRecord]]:
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


def _instantiate(url: str, asset: apprise.AppriseAsset | None = None):
    """apprise's plugin for ``url`` (what ``Apprise.add`` would keep), or None."""
    with _apprise_held():
        try:
            return apprise.Apprise.instantiate(url, asset=asset or apprise.AppriseAsset(storage_mode="memory"))
        except Exception:  # noqa: BLE001 - a plugin that raises is a URL it cannot use
            return None


def _misread(url: str, m: re.Match) -> str | None:
    """Why apprise would misread ``url`` (a password that is not percent-encoded), or None."""
    if _BAD_PERCENT.search(url):
        return "it holds a '%' that starts no %XX escape"
    if m["rest"].split("/", 1)[0].count("@") > 1:
        return "it holds more than one '@' before the host"
    return None


def _known_scheme(scheme: str) -> bool:
    try:
        return scheme in apprise.apprise.N_MGR  # the plugin registry Apprise.add consults
    except Exception:  # noqa: BLE001 - registry moved: let instantiate() decide
        return True


def _hostless(m: re.Match, plugin) -> bool:
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
    m = _URL_RE.match(url)
    if m is None or _misread(url, m):
        return _regex_mask(url)
    plugin = _instantiate(url)
    if plugin is not None and not _hostless(m, plugin):
        try:
            return _short(plugin.url(privacy=True))
        except Exception:  # noqa: BLE001
            pass
    return _regex_mask(url)


def _secrets_of(plugin) -> set[str]:
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


_SCRUBBER = _Scrubber()


def _install_scrubber() -> None:
    logger = logging.getLogger("apprise")
    if _SCRUBBER not in logger.filters:
        logger.addFilter(_SCRUBBER)


# --------------------------------------------------------------------------------------
# Where the URLs come from
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# The Notifier
# --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Delivery:
    """The outcome of one message to one service."""

    url: str  #: masked (see :func:`mask_url`)
    ok: bool
    detail: str  #: short reason, no secret


@dataclasses.dataclass
class _Service:
    plugin: Any
    masked: str
    tags: frozenset[str]

    def receives(self, event: str) -> bool:
        return not self.tags or event in self.tags or ALWAYS in self.tags

    @property
    def events(self) -> tuple[str, ...]:
        return tuple(e for e in EVENTS if self.receives(e))


def _tag_names(plugin) -> frozenset[str]:
    return frozenset(str(t).strip().lower() for t in (getattr(plugin, "tags", None) or ()) if str(t).strip())


class Notifier:
    """Sends a job's completion message to the configured services.

    Args:
        urls: apprise URLs (untagged: they receive every event).
        config_path: an apprise YAML or text configuration file (tags route events).
        timeout: seconds one :meth:`send` may take, retry included.
        attempts: tries per service, 1 or 2 (one retry at most).

    Raises:
        ConfigError: a URL apprise cannot use, or a configuration file that cannot be
            read or holds an entry apprise cannot load. The message shows the URL
            masked and says what to change.
    """

    def __init__(self, urls: Sequence[str] = (), config_path: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, attempts: int = DEFAULT_ATTEMPTS):
        _install_scrubber()
        if not timeout or timeout <= 0:
            raise ConfigError(f"the notification timeout must be a positive number of seconds, not {timeout!r}",
                              "notify")
        self.timeout = float(timeout)
        self.attempts = max(1, min(int(attempts), MAX_ATTEMPTS))
        self._asset = apprise.AppriseAsset(
            app_id="tfps", app_desc="TensorFlow parameter-server training",
            storage_mode="memory",  # nothing written to disk (read-only containers)
            default_service_retry=self.attempts - 1,
        )
        services: list[_Service] = []
        for url in urls or ():
            url = url.strip()
            if url:
                services.append(self._from_url(url))
        if config_path:
            services += self._from_config(config_path)
        self._services = self._merge(services)
        for service in self._services:
            self._limit(service.plugin)
            if service.tags and not service.events:
                log.warning("notification service %s is tagged %s, which names no event (%s, or %s): it "
                            "will receive no message", service.masked, ", ".join(sorted(service.tags)),
                            ", ".join(EVENTS), ALWAYS)
        if self._services:
            log.debug("notifications go to %s", "; ".join(self.describe()))

    @classmethod
    def from_settings(cls, cli_urls: Sequence[str] | None = None, config_path: str | None = None,
                      environ: Mapping[str, str] = os.environ, **kw) -> "Notifier":
        """A Notifier for ``--notify`` URLs, ``APPRISE_URLS`` and ``--notify_config``."""
        return cls(collect_urls(cli_urls, environ), config_path, **kw)

    # -- building ------------------------------------------------------------------------

    def _from_url(self, url: str) -> _Service:
        # A refused URL is one apprise may have misread, so only the scheme and host show.
        masked = _regex_mask(url)

        def refuse(reason: str, hint: bool = True) -> ConfigError:
            more = f"; {ENCODING_HINT}" if hint else ""
            return ConfigError(f"cannot use the notification URL {masked}: {reason}{more} (URL formats: "
                               f"{URL_HELP})", "notify")

        m = _URL_RE.match(url)
        if not m:
            raise refuse("it is not a URL; write it as scheme://..., for example "
                         "mailtos://user:password@smtp.example.com?to=ops@example.com", hint=False)
        scheme = m["scheme"].lower()
        if not _known_scheme(scheme):
            extra = "; Microsoft Teams is now workflows://" if scheme == "msteams" else ""
            raise refuse(f"apprise {apprise.__version__} knows no service {scheme}://{extra}", hint=False)
        misread = _misread(url, m)
        if misread:
            raise refuse(misread)
        plugin = _instantiate(url, self._asset)
        if plugin is None:
            email = " (an email URL also needs from=ADDRESS when the user name and host make no address)" \
                if scheme.startswith("mailto") else ""
            raise refuse(f"apprise cannot read it as a {scheme}:// URL{email}")
        if _hostless(m, plugin):
            raise refuse("apprise finds no host in it (an unencoded '@' or '/' in a password moves the host "
                         "into the password)")
        _SCRUBBER.add(_secrets_of(plugin))
        try:
            masked = _short(plugin.url(privacy=True))
        except Exception:  # noqa: BLE001
            pass
        return _Service(plugin, masked, _tag_names(plugin))

    def _from_config(self, path: str) -> list[_Service]:
        def refuse(reason: str) -> ConfigError:
            return ConfigError(f"{path}: {reason}", "notify_config")

        try:
            with open(path, "rb") as fh:
                fh.read(1)
        except OSError as e:
            raise refuse(f"cannot read it ({e.strerror}); give the path of an apprise YAML or text "
                         "configuration file") from None
        config = apprise.AppriseConfig(asset=self._asset)
        pending: list[Any] = []
        with _apprise_held() as held:
            ok = config.add(os.path.abspath(path))
            loader = apprise.Apprise(asset=self._asset)
            loader.add(config)
            plugins = list(loader.find(tag=apprise.common.MATCH_ALL_TAG, report=pending)) if ok else []
        errors = [r for r in held if r.levelno >= logging.ERROR]
        if pending:
            names = sorted({f"APPRISE_TEMPLATE_{str(n).upper()}" for t in pending
                            for n in (getattr(t, "template_names", None) or ())})
            one = len(pending) == 1
            raise refuse(f"{len(pending)} entr{'y waits' if one else 'ies wait'} for template values that are not "
                         f"set: set {' and '.join(names) or 'APPRISE_TEMPLATE_<NAME>'} in the environment, or give "
                         "a default in the file's template: section")
        if errors or not plugins:
            what = (f"apprise could not load {len(errors)} of its entries" if plugins
                    else "apprise found no usable notification URL in it")
            raise refuse(f"{what}; check the YAML or text syntax ({URL_HELP}/config) and every URL: "
                         f"{ENCODING_HINT}")
        services = []
        for plugin in plugins:
            _SCRUBBER.add(_secrets_of(plugin))
            try:
                masked = _short(plugin.url(privacy=True))
            except Exception:  # noqa: BLE001
                masked = f"{getattr(plugin, 'service_name', '?')} service"
            services.append(_Service(plugin, masked, _tag_names(plugin)))
        return services

    @staticmethod
    def _merge(services: list[_Service]) -> list[_Service]:
        """One service per URL: a URL given twice gets one message, for the union of events."""
        out: dict[str, _Service] = {}
        for s in services:
            try:
                key = s.plugin.url(privacy=False)
            except Exception:  # noqa: BLE001
                key = str(id(s.plugin))
            first = out.get(key)
            if first is None:
                out[key] = s
            elif first.tags:
                first.tags = frozenset() if not s.tags else first.tags | s.tags
        return list(out.values())

    def _limit(self, plugin) -> None:
        """Fit every socket wait and retry of the service into the send budget."""
        per_wait = self.timeout / self.attempts / 2  # connect + read, per attempt
        for attr in ("socket_connect_timeout", "socket_read_timeout"):
            current = getattr(plugin, attr, None)
            if isinstance(current, (int, float)) and current > 0:
                setattr(plugin, attr, min(float(current), per_wait))
        if isinstance(getattr(plugin, "retry", None), int):
            plugin.retry = min(plugin.retry, self.attempts - 1)

    # -- using ---------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """True when at least one service is configured."""
        return bool(self._services)

    def describe(self) -> list[str]:
        """The configured services' URLs, masked: for logs and ``tfps plan``."""
        return [s.masked for s in self._services]

    def routes(self) -> list[tuple[str, tuple[str, ...]]]:
        """(masked URL, events it receives) for every configured service."""
        return [(s.masked, s.events) for s in self._services]

    def send(self, event: str, results: Mapping[str, Any], attachments: Sequence[str] = ()) -> list[Delivery]:
        """Send the message for ``event`` to every service that takes it. Never raises.

        Args:
            event: one of :data:`EVENTS`.
            results: the job's results (see :func:`format_message`).
            attachments: files to attach (loss plot, results.json); missing ones are skipped.

        Returns:
            One :class:`Delivery` per service the event went to (empty if none takes it).
        """
        try:
            if event not in EVENTS:
                log.error("notification not sent: unknown event %r (expected one of %s)", event, ", ".join(EVENTS))
                return []
            selected = [s for s in self._services if s.receives(event)]
            if not selected:
                if self._services:
                    log.info("no notification service takes %r messages; none sent", event)
                return []
            try:
                title, body = format_message(event, results)
            except Exception as e:  # noqa: BLE001 - a message with less detail beats none
                log.warning("notification: could not format the results (%s); sending a short message",
                            _SCRUBBER.scrub(str(e)))
                job = results.get("job", "?") if isinstance(results, Mapping) else "?"
                title, body = f"[tfps] job {job} {event}", f"Job {job}: {event}.\n"
            return self._deliver(event, selected, title, body, NOTIFY_TYPES[event], attachments)
        except Exception as e:  # noqa: BLE001 - a notification never breaks the job
            log.error("notification %r not sent: %s: %s", event, type(e).__name__, _SCRUBBER.scrub(str(e)))
            return [Delivery(s.masked, False, f"not sent: {type(e).__name__}") for s in self._services
                    if s.receives(event)] if event in EVENTS else []

    def test(self) -> list[Delivery]:
        """Send a test message to every configured service, whatever its tags."""
        if not self._services:
            return []
        host = socket.gethostname()
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        title = f"[tfps] test message from {host}"
        body = (f"This is a test message sent by `tfps notify-test` on {host} at {now}.\n"
                "If you can read it, messages about training jobs will reach you here.\n")
        try:
            return self._deliver("test", list(self._services), title, body, apprise.NotifyType.INFO, ())
        except Exception as e:  # noqa: BLE001
            log.error("test message not sent: %s: %s", type(e).__name__, _SCRUBBER.scrub(str(e)))
            return [Delivery(s.masked, False, f"not sent: {type(e).__name__}") for s in self._services]

    def _deliver(self, what: str, selected: list[_Service], title: str, body: str, notify_type,
                 attachments: Sequence[str]) -> list[Delivery]:
        body = _SCRUBBER.scrub(body)
        title = _SCRUBBER.scrub(title)
        sender = apprise.Apprise(asset=self._asset)
        for service in selected:
            sender.add(service.plugin)
        attach = self._attachments(attachments)
        result = sender.notify(body=body, title=title, notify_type=notify_type,
                               body_format=apprise.NotifyFormat.TEXT, attach=attach, timeout=self.timeout)
        by_url: dict[str, list[Any]] = {}
        for r in result:
            by_url.setdefault(r.url, []).append(r)
        deliveries = []
        for service in selected:
            try:
                key = service.plugin.url(privacy=True)
            except Exception:  # noqa: BLE001
                key = None
            matches = by_url.get(key) or []
            r = matches.pop(0) if matches else None
            deliveries.append(self._outcome(service, r))
        for d in deliveries:
            if d.ok:
                log.info("notification %r delivered to %s", what, d.url)
            else:
                log.warning("notification %r: delivery failed to %s: %s", what, d.url, d.detail)
        ok = sum(d.ok for d in deliveries)
        log.info("notification %r: %d of %d service(s) took it", what, ok, len(deliveries))
        return deliveries

    def _outcome(self, service: _Service, r) -> Delivery:
        if r is None:
            return Delivery(service.masked, False, "not attempted")
        if r:
            return Delivery(service.masked, True, f"delivered in {r.elapsed:.1f} s")
        status = getattr(r.status, "name", str(r.status))
        if status == "TIMEOUT":
            return Delivery(service.masked, False, f"no answer within {self.timeout:g} s")
        reasons = [e.message for e in r.logs()
                   if e.level in ("WARNING", "ERROR", "CRITICAL") and "trying again" not in e.message]
        reason = _SCRUBBER.scrub(reasons[-1]) if reasons else "the service refused or could not be reached"
        tries = len(r.attempts)
        if tries > 1:
            reason = f"{reason} ({tries} attempts)"
        return Delivery(service.masked, False, reason[:300])

    @staticmethod
    def _attachments(paths: Sequence[str]) -> apprise.AppriseAttachment | None:
        files = []
        for path in paths or ():
            if path and os.path.isfile(path):
                files.append(path)
            elif path:
                log.warning("notification: attachment %s does not exist; sending without it", path)
        if not files:
            return None
        attach = apprise.AppriseAttachment()
        for path in files:
            attach.add(path)
        return attach


# --------------------------------------------------------------------------------------
# The message
# --------------------------------------------------------------------------------------

def _num(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _pairs(d: Any) -> str:
    if not isinstance(d, Mapping) or not d:
        return ""
    return ", ".join(f"{k} {_num(v)}" for k, v in d.items())


def _seconds(value: Any) -> str:
    try:
        s = float(value)
    except (TypeError, ValueError):
        return str(value)
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return f"{h} h {m} min {sec} s" if h else f"{m} min {sec} s"


def _parse_time(value: Any) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(value))
    except (TypeError, ValueError):
        return None


def _time(value: Any) -> str:
    t = _parse_time(value)
    if t is None:
        return str(value)
    if t.tzinfo is not None and t.utcoffset() == dt.timedelta(0):
        return t.strftime("%Y-%m-%d %H:%M:%S UTC")
    return t.strftime("%Y-%m-%d %H:%M:%S %z").strip()


def _cluster(cluster: Any) -> str:
    if not isinstance(cluster, Mapping):
        return ""
    parts = []
    for job, hosts in cluster.items():
        if isinstance(hosts, Mapping):  # {index: host} form of a sparse cluster
            hosts = list(hosts.values())
        if isinstance(hosts, (list, tuple)):
            parts.append(f"{job} {', '.join(str(h) for h in hosts)}")
    return "; ".join(parts)


def _short_error(error: Any, limit: int = 100) -> str:
    if not isinstance(error, Mapping):
        return str(error or "")[:limit]
    text = str(error.get("message") or error.get("type") or "").strip()
    text = text.splitlines()[0] if text else ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _title(event: str, r: Mapping[str, Any]) -> str:
    job = r.get("job") or "?"
    step = r.get("global_step")
    at = f" at step {step}" if step is not None else ""
    if event == "succeeded":
        return f"[tfps] ✔ job {job} succeeded{at}"
    if event == "failed":
        why = _short_error(r.get("error"))
        return f"[tfps] ✘ job {job} FAILED{at}" + (f": {why}" if why else "")
    if event == "stopped":
        return f"[tfps] job {job} stopped{at}"
    if event == "started":
        cluster = r.get("cluster") if isinstance(r.get("cluster"), Mapping) else {}
        sizes = ", ".join(f"{len(v)} {k}{'s' if len(v) != 1 and not k.endswith('s') else ''}"
                          for k, v in cluster.items() if isinstance(v, (list, tuple, Mapping)))
        mode = r.get("mode")
        detail = ", ".join(x for x in (sizes, f"{mode} updates" if mode else "") if x)
        return f"[tfps] job {job} started" + (f" ({detail})" if detail else "")
    return f"[tfps] job {job} {event}{at}"


_SUMMARY = {
    "succeeded": "Training finished.",
    "failed": "Training failed.",
    "stopped": "Training was stopped before its last step.",
    "started": "Training started.",
}


def format_message(event: str, results: Mapping[str, Any]) -> tuple[str, str]:
    """The (title, body) of the message for ``event``, in plain text.

    Every key of ``results`` may be missing except ``job`` and ``status``; missing
    values are left out rather than shown as None. Keys used: job, status, exit_code,
    model, mode, started_at, ended_at, duration_s, global_step, train_steps, final_loss,
    metrics, eval_metrics, times, checkpoint, export_dir, export_complete, model_dir,
    cluster, task, host, error {type, message, traceback_tail}.
    """
    r = results if isinstance(results, Mapping) else {}
    title = _title(event, r)
    rows: list[tuple[str, str]] = []

    def row(label: str, value: Any) -> None:
        if value is not None and value != "" and value != {}:
            rows.append((label, str(value)))

    error = r.get("error")
    if error and not isinstance(error, Mapping):
        error = {"message": str(error)}
    summary = _SUMMARY.get(event, f"Job {event}.")
    if event == "succeeded" and r.get("export_complete") is True:
        summary += " The model is exported."
    elif event == "succeeded" and r.get("export_complete") is False:
        summary += " The export is INCOMPLETE."
    elif event == "failed" and error:
        summary += " The error and the end of its traceback are below." if error.get("traceback_tail") else \
            " The error is below."

    status = r.get("status") or event
    if r.get("exit_code") is not None:
        status = f"{status} (exit code {r['exit_code']})"
    row("job", r.get("job"))
    row("status", status)
    if error:
        err = ": ".join(str(x) for x in (error.get("type"), error.get("message")) if x)
        row("error", err)
    model = ", ".join(x for x in (str(r.get("model") or ""), f"{r['mode']} updates" if r.get("mode") else "") if x)
    row("model", model)
    row("started", _time(r["started_at"]) if r.get("started_at") else None)
    row("ended", _time(r["ended_at"]) if r.get("ended_at") else None)
    duration = r.get("duration_s")
    if duration is None:
        t0, t1 = _parse_time(r.get("started_at")), _parse_time(r.get("ended_at"))
        if t0 and t1 and (t0.tzinfo is None) == (t1.tzinfo is None):
            duration = (t1 - t0).total_seconds()
    times = r.get("times") if isinstance(r.get("times"), Mapping) else {}
    phases = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {_seconds(v)}" for k, v in times.items())
    if duration is not None:
        row("duration", _seconds(duration) + (f" ({phases})" if phases else ""))
    elif phases:
        row("times", phases)
    step, total = r.get("global_step"), r.get("train_steps")
    if step is not None:
        row("global step", f"{step} of {total}" if total else step)
    elif total:
        row("train steps", total)
    row("final loss", _num(r["final_loss"]) if r.get("final_loss") is not None else None)
    row("metrics", _pairs(r.get("metrics")))
    row("eval", _pairs(r.get("eval_metrics")))
    row("checkpoint", r.get("checkpoint"))
    if r.get("export_dir"):
        state = {True: " (complete)", False: " (INCOMPLETE: no completion marker)"}.get(r.get("export_complete"), "")
        row("export", f"{r['export_dir']}{state}")
    row("model dir", r.get("model_dir"))
    row("hosts", _cluster(r.get("cluster")))
    where = " on ".join(str(x) for x in (r.get("task"), r.get("host")) if x)
    row("sent by", where)

    width = max(len(label) for label, _ in rows) + 2 if rows else 0
    lines = [summary, ""] + [f"{label.ljust(width)}{value}" for label, value in rows]
    tail = str(error.get("traceback_tail") or "").rstrip() if error else ""
    if tail:
        tail_lines = tail.splitlines()[-TRACEBACK_LINES:]
        tail = "\n".join(tail_lines)[-TRACEBACK_CHARS:]
        lines += ["", "Traceback (last lines):"] + ["  " + line for line in tail.splitlines()]
    return title, "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# tfps notify-test
# --------------------------------------------------------------------------------------

def notify_test(cli_urls: Sequence[str] | None, config_path: str | None, out: TextIO = sys.stdout,
                environ: Mapping[str, str] = os.environ) -> int:
    """Send a test message to every configured service and print one line per service.

    Lines read ``OK   <masked URL>`` or ``FAIL <masked URL>: <reason>``, with the events a
    tagged service receives in brackets.

    Returns:
        0 if every service took the message, 1 if any did not, 2 if nothing is
        configured or the configuration is bad (the message says what to change).
    """
    try:
        notifier = Notifier.from_settings(cli_urls, config_path, environ)
    except ConfigError as e:
        print(f"error: {e}", file=out)
        return 2
    if not notifier.enabled:
        print(f"error: no notification service configured: set {ENV_URLS}, pass --notify URL (repeatable) or "
              "--notify_config FILE", file=out)
        return 2
    events = dict(notifier.routes())
    deliveries = notifier.test()
    for d in deliveries:
        receives = events.get(d.url)
        route = f" [{', '.join(receives) or 'no event'}]" if receives is not None and receives != EVENTS else ""
        if d.ok:
            print(f"OK   {d.url}{route}", file=out)
        else:
            print(f"FAIL {d.url}{route}: {d.detail}", file=out)
    return 0 if deliveries and all(d.ok for d in deliveries) else 1
