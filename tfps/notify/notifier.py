"""The Notifier: one message per job event to the configured apprise services.

Picks which services receive an event (tags), bounds every send in time, retries once,
and never raises into the job. ``notify_test`` is ``tfps notify-test``; ``orphan_failure``
is the failure message of a chief that died without sending one. The user's
manual (URL sources, tags, passwords, time budget) is docs/notifications.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import apprise

from tfps import timeouts
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.notify.message import format_message
from tfps.notify.secrets import (
    SCRUBBER,
    URL_RE,
    apprise_held,
    hostless,
    install_scrubber,
    instantiate,
    known_scheme,
    misread,
    regex_mask,
    secrets_of,
    short,
)
from tfps.notify.urls import ENV_URLS, ENV_URLS_FILE, collect_urls
from tfps.outcome.contract import ErrorInfo, JobResult
from tfps.outcome.results import now_iso

log = logging.getLogger("tfps.notify")

#: The events a job can report. ``started`` and ``progress`` are sent only when asked for
#: (``--notify_started``, ``--notify_every``); ``stalled`` when ``--stall_timeout`` passes without progress;
#: ``exports_failing`` when the versions of ``--export_every`` failed several times in a row.
EVENTS = ("started", "progress", "stalled", "exports_failing", "succeeded", "failed", "stopped")
#: A service tagged ``always`` receives every event (apprise's own name for this tag).
ALWAYS = apprise.common.MATCH_ALWAYS_TAG
DEFAULT_ATTEMPTS = 2
#: One retry at most: a message that two attempts could not deliver is not worth a
#: longer wait at the end of a job.
MAX_ATTEMPTS = 2

NOTIFY_TYPES = {
    "started": apprise.NotifyType.INFO,
    "progress": apprise.NotifyType.INFO,
    "stalled": apprise.NotifyType.WARNING,
    "exports_failing": apprise.NotifyType.WARNING,
    "succeeded": apprise.NotifyType.SUCCESS,
    "failed": apprise.NotifyType.FAILURE,
    "stopped": apprise.NotifyType.WARNING,
}

ENCODING_HINT = (
    "percent-encode special characters in user names, passwords and tokens: "
    "@ as %40, % as %25, ; as %3B, / as %2F, : as %3A, # as %23, ? as %3F, & as %26"
)
URL_HELP = "https://github.com/caronc/apprise/wiki"


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
                 timeout: float = timeouts.NOTIFY_ATTEMPT_SECS, attempts: int = DEFAULT_ATTEMPTS):
        install_scrubber()
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
                      environ: Mapping[str, str] = os.environ, **kw) -> Notifier:
        """A Notifier for ``--notify`` URLs, ``APPRISE_URLS`` and ``--notify_config``."""
        return cls(collect_urls(cli_urls, environ), config_path, **kw)

    # -- building ------------------------------------------------------------------------

    def _from_url(self, url: str) -> _Service:
        # A refused URL is one apprise may have misread, so only the scheme and host show.
        masked = regex_mask(url)

        def refuse(reason: str, hint: bool = True) -> ConfigError:
            more = f"; {ENCODING_HINT}" if hint else ""
            return ConfigError(f"cannot use the notification URL {masked}: {reason}{more} (URL formats: "
                               f"{URL_HELP})", "notify")

        m = URL_RE.match(url)
        if not m:
            raise refuse("it is not a URL; write it as scheme://..., for example "
                         "mailtos://user:password@smtp.example.com?to=ops@example.com", hint=False)
        scheme = m["scheme"].lower()
        if not known_scheme(scheme):
            extra = "; Microsoft Teams is now workflows://" if scheme == "msteams" else ""
            raise refuse(f"apprise {apprise.__version__} knows no service {scheme}://{extra}", hint=False)
        why = misread(url, m)
        if why:
            raise refuse(why)
        plugin = instantiate(url, self._asset)
        if plugin is None:
            email = " (an email URL also needs from=ADDRESS when the user name and host make no address)" \
                if scheme.startswith("mailto") and "from=" not in (m["query"] or "").lower() else ""
            raise refuse(f"apprise cannot read it as a {scheme}:// URL{email}")
        if hostless(m, plugin):
            raise refuse("apprise finds no host in it (an unencoded '@' or '/' in a password moves the host "
                         "into the password)")
        SCRUBBER.add(secrets_of(plugin))
        try:
            masked = short(plugin.url(privacy=True))
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
        with apprise_held() as held:
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
            SCRUBBER.add(secrets_of(plugin))
            try:
                masked = short(plugin.url(privacy=True))
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

    def send(self, event: str, results: JobResult | Mapping[str, Any],
             attachments: Sequence[str] = ()) -> list[Delivery]:
        """Send the message for ``event`` to every service that takes it. Never raises.

        Args:
            event: one of :data:`EVENTS`.
            results: the job's record, or a message's figures (see :func:`format_message`).
            attachments: files to attach (loss plot, results.json); missing ones are skipped.

        Returns:
            One :class:`Delivery` per service the event went to (empty if none takes it).
        """
        try:
            if isinstance(results, JobResult):
                results = results.to_dict()
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
                            SCRUBBER.scrub(str(e)))
                job = results.get("job", "?") if isinstance(results, Mapping) else "?"
                title, body = f"[tfps] job {job} {event}", f"Job {job}: {event}.\n"
            return self._deliver(event, selected, title, body, NOTIFY_TYPES[event], attachments)
        except Exception as e:  # noqa: BLE001 - a notification never breaks the job
            log.error("notification %r not sent: %s: %s", event, type(e).__name__, SCRUBBER.scrub(str(e)))
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
            log.error("test message not sent: %s: %s", type(e).__name__, SCRUBBER.scrub(str(e)))
            return [Delivery(s.masked, False, f"not sent: {type(e).__name__}") for s in self._services]

    def _deliver(self, what: str, selected: list[_Service], title: str, body: str, notify_type,
                 attachments: Sequence[str]) -> list[Delivery]:
        body = SCRUBBER.scrub(body)
        title = SCRUBBER.scrub(title)
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
        reason = SCRUBBER.scrub(reasons[-1]) if reasons else "the service refused or could not be reached"
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


def notify_test(cli_urls: Sequence[str] | None, config_path: str | None, out: TextIO | None = None,
                environ: Mapping[str, str] = os.environ, err: TextIO | None = None) -> ExitCode:
    """Send a test message to every configured service and print one line per service.

    Lines read ``OK   <masked URL>`` or ``FAIL <masked URL>: <reason>``, with the events a
    tagged service receives in brackets; they go to ``out`` (stdout). A configuration that
    cannot be used is one ``tfps: error: ...`` line on ``err`` (stderr).

    Returns:
        ``OK`` if every service took the message, ``TRAINING_FAILED`` (1) if any did not,
        ``BAD_CONFIG`` (2) if nothing is configured or the configuration is bad (the
        message says what to change).
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        notifier = Notifier.from_settings(cli_urls, config_path, environ)
    except ConfigError as e:
        print(f"tfps: error: {e}", file=err)
        return ExitCode.BAD_CONFIG
    if not notifier.enabled:
        print(f"tfps: error: no notification service configured: set {ENV_URLS} or {ENV_URLS_FILE}, pass "
              "--notify URL (repeatable) or --notify_config FILE", file=err)
        return ExitCode.BAD_CONFIG
    events = dict(notifier.routes())
    deliveries = notifier.test()
    for d in deliveries:
        receives = events.get(d.url)
        route = f" [{', '.join(receives) or 'no event'}]" if receives is not None and receives != EVENTS else ""
        if d.ok:
            print(f"OK   {d.url}{route}", file=out)
        else:
            print(f"FAIL {d.url}{route}: {d.detail}", file=out)
    return ExitCode.OK if deliveries and all(d.ok for d in deliveries) else ExitCode.TRAINING_FAILED


def orphan_failure(cfg, urls: list[str], reason: str, lost_tasks: list[str] | None = None) -> bool:
    """Send the failure message for a chief that died without sending one (orchestrators:
    ``tfps local``, ``tfps notify-failure`` run by the Ansible role).

    Returns True when every configured service took the message (or none is configured).
    """
    try:
        notifier = Notifier(urls, cfg.notify_config)
    except Exception as e:  # noqa: BLE001
        log.error("cannot send the failure message: %s", e)
        return False
    if not notifier.enabled:
        return True
    res = JobResult(job=cfg.name, status="failed", model=cfg.model, ended_at=now_iso(),
                    model_dir=os.path.abspath(cfg.model_dir), train_steps=cfg.train_steps,
                    error=ErrorInfo(type="ChiefLost", message=reason), lost_tasks=sorted(lost_tasks or ()))
    return all(d.ok for d in notifier.send("failed", res))
