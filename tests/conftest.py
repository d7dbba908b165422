"""Shared pytest fixtures, and ``--fail-on-skip`` (set by ``make test``).

On a machine like the CI's every test can run: the project's scripts install and start
what the tests need (.ci/docker-up.sh, .ci/build-image.sh, ...). So under
``--fail-on-skip`` a test that skips for any reason but a missing GPU fails the session,
and the end of the run says how many tests passed and how many skipped. Ad-hoc runs
(``pytest tests/unit -k x``) are unaffected.
"""

from __future__ import annotations

import os
import resource

import pytest
from servers import SMTPServer, WebhookServer  # tests/ is on sys.path: pytest puts this conftest's directory there


@pytest.fixture
def smtp_server(request):
    """A real SMTP server on 127.0.0.1 (aiosmtpd) that keeps parsed messages.

    Require AUTH with indirect parametrization:
    ``@pytest.mark.parametrize("smtp_server", [{"auth": ("user", "pw")}], indirect=True)``.
    """
    with SMTPServer(**getattr(request, "param", {})) as server:
        yield server


@pytest.fixture
def webhook_server():
    """A real HTTP server on 127.0.0.1 that records JSON POST bodies."""
    with WebhookServer() as server:
        yield server


# ------------------------------------------------------------------ --fail-on-skip
def pytest_addoption(parser):
    parser.addoption("--fail-on-skip", action="store_true", default=False,
                     help="fail the session when a test skips for a reason that does not mention a GPU "
                          "(make test sets it)")


_outcomes: dict[str, list] = {"passed": [], "skipped": []}


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:   # (path, line, "Skipped: reason")
        return str(longrepr[2])
    return str(longrepr)


def _record(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _outcomes["skipped"].append(report)
    elif report.passed and report.when == "call" and not hasattr(report, "wasxfail"):
        _outcomes["passed"].append(report)


def pytest_runtest_logreport(report):
    _record(report)


def pytest_collectreport(report):
    _record(report)   # a whole module skipped at import (pytest.importorskip, allow_module_level)


def _not_for_a_gpu() -> list:
    return [r for r in _outcomes["skipped"] if "gpu" not in _skip_reason(r).lower()]


# ------------------------------------------------------------------ CPU seconds per test
# The suite's time on a 2-core CI machine is set by the CPU its processes use (the two halves
# of `make test` share the cores), not by their waits: `make test` lists the tests that cost
# the most CPU next to pytest's wall-clock durations. Counted: this process and every child
# process it waited for (with the children those waited for: a launcher's tasks). Not counted:
# processes in containers or on the test hosts, whose CPU Docker's daemon owns.
_cpu: dict[str, float] = {}


def _cpu_now() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _cpu_now()
    yield
    _cpu[item.nodeid] = _cpu_now() - before


def _cpu_summary(terminalreporter) -> None:
    if not _cpu:
        return
    count = int(os.environ.get("TFPS_TEST_CPU_TOP", "30"))
    top = sorted(_cpu.items(), key=lambda kv: -kv[1])[:count]
    terminalreporter.write_line(f"CPU seconds of this pytest and the processes it waited for: {sum(_cpu.values()):.0f} "
                                f"over {len(_cpu)} tests; the {len(top)} that cost the most:")
    for nodeid, secs in top:
        terminalreporter.write_line(f"{secs:8.1f}s cpu  {nodeid}")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not config.getoption("fail_on_skip"):
        return
    _cpu_summary(terminalreporter)
    bad = _not_for_a_gpu()
    passed, skipped = len(_outcomes["passed"]), len(_outcomes["skipped"])
    terminalreporter.write_line(f"tfps tests: {passed} passed, {skipped} skipped "
                                f"({skipped - len(bad)} for a missing GPU)")
    if bad:
        terminalreporter.write_line(f"FAILED: {len(bad)} test(s) skipped for a reason other than a missing GPU; "
                                    "make them run here (install or start what they need):", red=True, bold=True)
        for r in bad:
            terminalreporter.write_line(f"  {r.nodeid}: {_skip_reason(r)}", red=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if session.config.getoption("fail_on_skip") and exitstatus == pytest.ExitCode.OK and _not_for_a_gpu():
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
