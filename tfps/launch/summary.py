"""The end of ``tfps local``: the chief's results.json read back, with what only the launcher
saw (tasks lost while the job ran), printed as the job's summary; or, when the chief of this
launch never reported, the failure message sent in its place.
"""

from __future__ import annotations

import logging
import os
import shlex

from tfps.config import RunConfig
from tfps.launch.tasks import describe_code, say
from tfps.outcome import results
from tfps.outcome.contract import JobResult, ResultsError

log = logging.getLogger("tfps")


def chief_reported(cfg: RunConfig, launched: float) -> bool:
    """Whether the chief of this launch wrote its results.json (``JobResult.written_since``)."""
    try:
        return JobResult.load(os.path.join(cfg.model_dir, results.RESULTS)).written_since(launched)
    except (OSError, ResultsError):
        return False


def summarize(cfg: RunConfig, code, launched: float, urls: list[str], lost: dict[str, str],
              why: str | None = None, chief_sent: bool = False) -> bool:
    """Read the chief's results.json, add what only the launcher saw, print the summary.

    Results count only if the chief of this launch wrote them (``JobResult.written_since``);
    otherwise the chief died without reporting, and the launcher sends the failure message
    (``why`` says what ended it, when the launcher knows), unless the chief said that it
    sent the job's message although it could not write results.json (``chief_sent``: a full
    disk; one message per job). Returns whether the chief reported."""
    path = os.path.join(cfg.model_dir, results.RESULTS)
    res = None
    try:
        res = JobResult.load(path)
    except FileNotFoundError:
        pass
    except (OSError, ResultsError) as e:
        log.error("%s", e)
    if (res is None or not res.written_since(launched)) and chief_sent:
        say(log.error, "the chief exited with %s and sent the job's message, but could not write %s (see its "
            "line above)", describe_code(code), path)
        return True
    if res is None or not res.written_since(launched):
        say(log.error, "the chief exited with %s without writing results%s", describe_code(code),
             f" ({why})" if why else "")
        from tfps.notify import orphan_failure  # lazy: imports apprise (through tfps.notify's __getattr__)
        orphan_failure(cfg, urls, why or f"the chief process exited with {describe_code(code)} before reporting",
                       sorted(lost))
        return False
    if lost:
        # What only the launcher saw: tasks that died while the job ran (a worker whose
        # loss the job survived, in async mode), next to what the chief recorded.
        res.add_lost_tasks(lost).save(path)
    try:
        model_dir = os.path.abspath(cfg.model_dir)
        plots = [os.path.join(model_dir, p) for p in ("loss.png", "metrics.png")
                 if os.path.exists(os.path.join(model_dir, p))]
        more = [("plots", ", ".join(plots))] if plots else []
        more.append(("curves", f"tensorboard --logdir {shlex.quote(model_dir)}"))
        print("\n".join(res.summary_lines(results_path=os.path.abspath(path), more=more)), flush=True)
    except (OSError, ValueError):
        pass   # the terminal has closed (SIGHUP): results.json and the message have it all
    return True
