"""Filters of the tfps role over the chief's results.json: how the job ended, and its summary.

The judgement and the summary are tfps's own (tfps.outcome.contract: ``JobResult``,
``run_outcome``, ``summary_lines``), the same code that ``tfps local`` uses; these filters
only unpack what the play holds (a slurp result, a container's State) for them. Like the
other filters, they import tfps when called, from the controller's Python.
"""

from __future__ import annotations

import base64


def _results_text(results):
    """The text (or record) of results.json from a slurp result, a string or a dict."""
    if results is None:
        return None
    if isinstance(results, dict) and "content" in results:   # ansible.builtin.slurp
        content = results["content"]
        return base64.b64decode(content) if results.get("encoding", "base64") == "base64" else content
    if isinstance(results, dict) and "job" not in results:   # a slurp that failed or was skipped
        return None
    return results


def tfps_job_outcome(results, chief_state=None, script=False, chief="the chief", chief_host=None,
                     results_file="results.json"):
    """How the job ended: ``{status, fresh, results, chief_exit, reason}``.

    ``results``: the slurp of results.json on the chief's host (or its text, or the record);
    ``chief_state``: the chief container's ``State`` (docker_container_info), {} when it is
    gone. The results count only when the chief of this container run wrote them
    (``JobResult.written_since`` its ``StartedAt``); see ``tfps.outcome.contract.run_outcome``.
    """
    from tfps.outcome.contract import run_outcome

    state = chief_state or {}
    started = state.get("StartedAt")
    if started and str(started).startswith("0001-01-01"):   # Docker's "never started"
        started = None
    return run_outcome(_results_text(results), chief_exit=state.get("ExitCode"),
                       oom_killed=bool(state.get("OOMKilled")), chief_started_at=started, script=bool(script),
                       chief=chief, chief_host=chief_host, results_file=results_file)


def tfps_results(results):
    """The record of results.json (a slurp result, its text or a dict) read through
    ``JobResult``, as a dict; {} when there is none or it cannot be read."""
    from tfps.outcome.contract import JobResult, ResultsError

    text = _results_text(results)
    if text is None:
        return {}
    try:
        record = JobResult.from_dict(text) if isinstance(text, dict) else JobResult.from_json(text)
    except ResultsError:
        return {}
    return record.to_dict()


def tfps_container_exits(containers):
    """{container name: exit code} of docker_container_info's ``container`` records."""
    return {str(c.get("Name", "?")).lstrip("/"): (c.get("State") or {}).get("ExitCode") for c in containers if c}


def tfps_summary_lines(outcome, job, chief_host=None, results_dir=".", chief_name="worker0", ok_statuses=("succeeded",),
                       chief_log=""):
    """The lines the play shows at the end of a job (``tfps.outcome.contract.summary_lines``):
    ``outcome`` is tfps_job_outcome's answer with ``tasks`` (tfps_container_exits)."""
    from tfps.outcome.contract import JobResult, summary_lines

    record = JobResult.from_dict(outcome["results"]) if outcome.get("results") else None
    more = []
    if outcome["status"] not in ok_statuses:
        more.append(("chief log", "%s/logs/%s.full.log (whole)" % (results_dir, chief_name)))
    more.append(("logs", "%s/logs/" % results_dir))
    tasks = outcome.get("tasks") or {}
    more.append(("tasks", ", ".join("%s exit %s" % (name, code) for name, code in tasks.items())))
    tail = [line.strip() for line in str(chief_log or "").splitlines() if line.strip()][-15:]
    return summary_lines(record, job=job, status=outcome["status"], reason=outcome.get("reason") or "",
                         host=chief_host, results_path="%s/results.json" % results_dir if record else None,
                         more=more, tail=tail, tail_title="last lines of the chief's log:")


class FilterModule:
    def filters(self):
        return {"tfps_job_outcome": tfps_job_outcome, "tfps_container_exits": tfps_container_exits,
                "tfps_summary_lines": tfps_summary_lines, "tfps_results": tfps_results}
