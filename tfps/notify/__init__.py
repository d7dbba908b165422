"""Notifications: the one completion message per job, sent through apprise.

``notifier`` sends (and routes events by tags), ``urls`` gathers the URLs, ``secrets``
keeps passwords and tokens out of sight, ``message`` writes the text. The user's manual
(where URLs come from, tags, passwords, time budget) is docs/notifications.md.

``job_notifier`` is the chief's Notifier, which it hands to ``tfps.outcome.report.Reporter``:
notify sits above outcome (it reads ``JobResult``), so outcome never imports it.

The names below are re-exported so that ``from tfps.notify import Notifier,
collect_urls`` keeps working for code outside the package.
"""

import importlib
import logging
import os

from tfps.notify.urls import collect_urls

log = logging.getLogger("tfps")

# Loaded on first use: a task that sends nothing (a ps, a worker) never imports apprise.
_HOMES = {"format_message": "message", "EVENTS": "notifier", "Delivery": "notifier", "Notifier": "notifier",
          "notify_test": "notifier", "orphan_failure": "notifier", "mask_url": "secrets", "ENV_URLS": "urls",
          "collect_urls": "urls"}


def notifier_for(cli_urls, config_path, environ=os.environ):
    """The Notifier for ``--notify`` URLs, ``APPRISE_URLS`` and ``--notify_config``, or None
    when none is configured. Whether any is is decided without apprise, whose import is tens
    of milliseconds of every chief's start-up: a job that sends nothing never loads it."""
    if not config_path and not collect_urls(cli_urls, environ):
        return None
    from tfps.notify.notifier import Notifier  # lazy: imports apprise
    return Notifier.from_settings(cli_urls, config_path, environ)


def job_notifier(cfg):
    """The chief's Notifier for the job ``cfg`` (``notifier_for`` its settings), or None: none
    is configured, or the settings were refused (a bad URL is refused before the job starts,
    by ``tfps.task.entry``; here a job never fails for it)."""
    try:
        return notifier_for(cfg.notify, cfg.notify_config)
    except Exception as e:  # noqa: BLE001
        log.error("notifications disabled: %s", e)
        return None


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'tfps.notify' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tfps.notify.{_HOMES[name]}"), name)


__all__ = ["EVENTS", "ENV_URLS", "Delivery", "Notifier", "collect_urls", "format_message", "job_notifier",
           "mask_url", "notifier_for", "notify_test", "orphan_failure"]
