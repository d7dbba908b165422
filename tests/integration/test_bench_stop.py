"""A bench that is stopped (SIGTERM, SIGINT, SIGHUP sent to it alone, as `timeout` or a
closed terminal does) ends every process it started, whatever their session (issue 52:
a classic ps was still running 40 minutes after the bench hit its timeout).

Stand-ins without TensorFlow play the bench's processes: a ps that blocks forever, and a
launcher that ignores SIGTERM and whose task has a session of its own (as ``tfps local``'s
forked tasks do). Cost: three sleeping Python processes per signal, about a second each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")

DRIVER = textwrap.dedent(f"""
    import sys, time
    sys.path.insert(0, {os.path.abspath(BENCH)!r})
    import procs
    procs.install()
    forever = "import time; time.sleep(600)"
    ps = procs.spawn([sys.executable, "-c", forever])
    launcher = procs.spawn([sys.executable, "-c", '''
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    task = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    print(task.pid, flush=True)
    time.sleep(600)
    '''])
    task = int(launcher.stdout.readline())
    print("PIDS", ps.pid, launcher.pid, task, flush=True)
    time.sleep(600)
""")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stopped_bench_ends_every_process_it_started(sig):
    bench = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    pids = []
    try:
        line = bench.stdout.readline()
        assert line.startswith("PIDS"), (line, bench.stderr.read() if bench.poll() is not None else "")
        pids = [int(p) for p in line.split()[1:]]
        assert not any(_gone(p) for p in pids)
        os.kill(bench.pid, sig)                    # the bench alone, not its group
        code = bench.wait(60)
        deadline = time.time() + 30
        while time.time() < deadline and not all(_gone(p) for p in pids):
            time.sleep(0.1)
        assert [p for p in pids if not _gone(p)] == []
        assert code == 128 + sig
        assert "ending every process it started" in bench.stderr.read()
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        if bench.poll() is None:
            bench.kill()
            bench.wait()
