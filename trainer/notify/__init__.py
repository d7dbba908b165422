"""Notifications: the one completion message per job, sent through apprise.

``notifier`` sends (and routes events by tags), ``urls`` gathers the URLs, ``secrets``
keeps passwords and tokens out of sight, ``message`` writes the text. The user's manual
(where URLs come from, tags, passwords, time budget) is docs/notifications.md.

The names below are re-exported so that ``from trainer.notify import Notifier,
collect_urls`` keeps working for code outside the package.
"""

from trainer.notify.message import format_message
from trainer.notify.notifier import EVENTS, Delivery, Notifier, notify_test
from trainer.notify.secrets import mask_url
from trainer.notify.urls import ENV_URLS, collect_urls

__all__ = ["EVENTS", "ENV_URLS", "Delivery", "Notifier", "collect_urls", "format_message", "mask_url",
           "notify_test"]
