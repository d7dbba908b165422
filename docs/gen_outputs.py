"""Write the output the tutorials show from real runs of their own commands.

A tutorial shows what a command prints in a fenced ``text`` block right under a marker line::

    <!-- output: first-job (written by `make docs-outputs` from a real run; do not edit) -->

``python docs/gen_outputs.py`` (``make docs-outputs``) runs each command of ``OUTPUTS``
as the page gives it, in a scratch directory (``tfps`` being this checkout's), and writes
what it printed into that block, the scratch directory's path shown as ``/srv/ml``. ``--only
KEY`` runs one; ``--check`` runs the quick ones (``quick=True``: no training) and exits 1,
naming each page whose block is stale, instead of writing. A tutorial whose steps run side by
side (a job, and a partition landed while it runs) is played by a walk instead
(``walk_stream``: docs/tutorials/continuous-training.md), whose result its outputs read;
tests/integration/test_follow.py walks the same steps at its own scale. tests/unit/test_docs_outputs.py
checks that every marker names an output and every output has its marker;
tests/integration/test_docs_quick_outputs.py that the quick outputs are current; and
tests/integration/test_async_job.py that the first job's block has the lines a real run of
its command prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
MARKER = re.compile(r"^<!-- output: (?P<key>[\w-]+) "
                    r"\(written by `make docs-outputs` from a real run; do not edit\) -->\n"
                    r"```text\n(?P<body>.*?)^```\n", re.S | re.M)


#: Where the pages' commands run (the scratch directory, as the pages show it).
WORKDIR = "/srv/ml"


def _summary(text: str) -> str:
    """The launcher's summary: from its ``job ... SUCCEEDED`` line to the end."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"job \S+ (SUCCEEDED|FAILED|STOPPED)", line))
    return "\n".join(lines[start:]) + "\n"


def _script_head(_text: str, scratch: Path) -> str:
    """The first lines of the script ``tfps slurm -o job.sbatch`` wrote: its ``#SBATCH`` header."""
    lines = (scratch / "job.sbatch").read_text().splitlines()
    end = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    return "\n".join(lines[:end]) + "\n"


@dataclasses.dataclass(frozen=True)
class Output:
    page: str
    #: The tfps commands, as the page gives them (argv after ``tfps``); the last one's output is shown.
    commands: tuple[tuple[str, ...], ...]
    #: What to show of the last command's output (stdout and stderr together).
    keep: Callable[..., str] = lambda text: text
    #: No training: cheap enough for a unit test to run and compare.
    quick: bool = False
    #: Scratch set-up: a copy of the example inventory as inventory/mycluster.
    inventory: bool = False
    #: Instead of ``commands``: a walk through the page's steps, ``walk(scratch, env)``, whose
    #: result ``keep`` reads (one walk serves every output that names it).
    walk: Callable[..., object] | None = None


# ----------------------------------------------------------------------------- the stream tutorial
STREAM_PAGE = "tutorials/continuous-training.md"
STREAM_TEST = "tests/integration/test_follow.py"


@dataclasses.dataclass(frozen=True)
class StreamWalk:
    """What a walk through the continuous-training tutorial printed and left."""
    stopped: str             # the job of step 2 (stopped by Ctrl-C): its output
    stopped_rc: int
    stopped_results: dict
    resumed: str             # the job of step 4 (resumed, ends by --until): its output
    resumed_rc: int
    read: str                # what step 5 printed
    results: dict            # results.json at the end


def walk_stream(scratch: Path, env: dict, extra: tuple[str, ...] = (), timeout: float = 600) -> StreamWalk:
    """Every command of docs/tutorials/continuous-training.md as the page gives it, in
    ``scratch`` (``tfps`` and ``python`` on the PATH being this interpreter's), in the page's
    order: step 1; the job of step 2, until the chief says it is at hour 02 with nothing
    behind; step 3; Ctrl-C (SIGINT to the job's process group, as a terminal sends it) once
    the chief is at hour 03; step 4, to the job's end; step 5. ``extra`` goes after the
    arguments of each ``tfps local`` (a test's small scale)."""
    sys.path.insert(0, str(REPO / "tests"))
    import docblocks
    setup, start, land, resume, read = docblocks.steps(STREAM_PAGE, STREAM_TEST)
    (scratch / "hours.py").write_text(docblocks.block(STREAM_PAGE, "# hours.py", lang="python"))
    bindir = scratch / ".bin"
    bindir.mkdir()
    for name, argv in (("tfps", f"{sys.executable} -m tfps"), ("python", sys.executable)):
        (bindir / name).write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        (bindir / name).chmod(0o755)
    env = {**env, "PATH": f"{bindir}{os.pathsep}{env.get('PATH', os.defpath)}"}

    def shell(block: str) -> str:
        """The block's commands but its ``tfps local``, through bash; what they printed."""
        out = ""
        for argv in docblocks.argvs(block):
            if argv[:2] != ["tfps", "local"]:
                p = subprocess.run(["bash", "-c", shlex.join(argv)], cwd=scratch, env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, check=False)
                if p.returncode != 0:
                    raise RuntimeError(f"docs/{STREAM_PAGE}: {shlex.join(argv)} exited with {p.returncode}:\n"
                                       f"{p.stdout[-3000:]}")
                out += p.stdout
        return out

    def job(block: str, log: Path) -> subprocess.Popen:
        (argv,) = [a for a in docblocks.argvs(block) if a[:2] == ["tfps", "local"]]
        with open(log, "w") as fh:
            return subprocess.Popen([sys.executable, "-m", "tfps", *argv[1:], *extra], cwd=scratch, env=env,
                                    stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_for(proc: subprocess.Popen, log: Path, pattern: str, what: str) -> None:
        end = time.monotonic() + timeout
        while not re.search(pattern, log.read_text(), re.M):
            if proc.poll() is not None or time.monotonic() > end:
                why = f"exited with {proc.returncode}" if proc.returncode is not None else "timed out"
                raise RuntimeError(f"docs/{STREAM_PAGE}: waiting for {what}, the job {why}:\n"
                                   f"{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def results() -> dict:
        return json.loads((scratch / "runs" / "stream" / "results.json").read_text())

    at = r"chief: stream at partition \S*/hour={:02d} \(slice \d+\); newest complete \S*/hour={:02d}, 0 partition"
    logs = scratch / ".logs"
    logs.mkdir()
    proc = None
    try:
        shell(setup)
        proc = job(start, logs / "stopped")
        wait_for(proc, logs / "stopped", at.format(2, 2), "the chief at hour 02, nothing behind")
        shell(land)
        wait_for(proc, logs / "stopped", at.format(3, 3), "the chief at hour 03, nothing behind")
        os.killpg(proc.pid, signal.SIGINT)
        stopped_rc = proc.wait(timeout)
        stopped, stopped_results = (logs / "stopped").read_text(), results()
        shell(resume)
        proc = job(resume, logs / "resumed")
        resumed_rc = proc.wait(timeout)
        return StreamWalk(stopped, stopped_rc, stopped_results, (logs / "resumed").read_text(), resumed_rc,
                          shell(read), results())
    finally:
        if proc is not None and proc.poll() is None:   # a walk that failed half-way: a stop, then a kill
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _chief_at_hour_02(walk: StreamWalk) -> str:
    """The chief's line of step 2: at hour 02, nothing behind."""
    return next(line for line in walk.stopped.splitlines()
                if re.search(r"chief: stream at partition \S*/hour=02 .* 0 partition", line)) + "\n"


OUTPUTS: dict[str, Output] = {
    "first-job": Output("tutorials/first-job.md",
                        (("local", "--ps", "1", "--workers", "2", "--train-steps", "200",
                          "--model-dir", "runs/first"),),
                        keep=_summary),
    "plan": Output("tutorials/ansible.md", (("plan", "-i", "inventory/mycluster"),), quick=True, inventory=True),
    "slurm-script": Output("tutorials/slurm.md",
                           (("slurm", "--ps", "1", "--workers", "4", "--nodes", "5", "--time", "4:00:00",
                             "--train_steps", "20000", "-o", "job.sbatch"),),
                           keep=_script_head, quick=True),
    "continuous-training-chief": Output(STREAM_PAGE, (), keep=_chief_at_hour_02, walk=walk_stream),
    "continuous-training": Output(STREAM_PAGE, (), keep=lambda walk: _summary(walk.resumed), walk=walk_stream),
    "continuous-training-results": Output(STREAM_PAGE, (), keep=lambda walk: walk.read, walk=walk_stream),
}

#: The walks done in this process (one walk serves each output that names it): walk -> (result, scratch).
_WALKED: dict = {}


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "COLUMNS": "120", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("APPRISE_URLS", None)
    return env


def run(key: str) -> str:
    """The block of output ``key``: its commands run in a scratch directory, the scratch path taken out."""
    out = OUTPUTS[key]
    if out.walk is not None:
        if out.walk not in _WALKED:
            scratch = Path(tempfile.mkdtemp(prefix="tfps-docs-"))
            try:
                _WALKED[out.walk] = out.walk(scratch, _env()), scratch
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        walked, scratch = _WALKED[out.walk]
        return out.keep(walked).replace(str(scratch.resolve()), WORKDIR).replace(str(scratch), WORKDIR)
    scratch = Path(tempfile.mkdtemp(prefix="tfps-docs-"))
    try:
        if out.inventory:
            shutil.copytree(REPO / "inventory" / "example", scratch / "inventory" / "mycluster")
        env = _env()
        text = ""
        for argv in out.commands:
            p = subprocess.run([sys.executable, "-m", "tfps", *argv], cwd=scratch, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600, check=False)
            if p.returncode != 0:
                raise SystemExit(f"docs/gen_outputs.py: {key}: tfps {' '.join(argv)} exited with "
                                 f"{p.returncode}:\n{p.stdout[-3000:]}")
            text = p.stdout
        keep = out.keep
        shown = keep(text, scratch) if keep.__code__.co_argcount == 2 else keep(text)
        return shown.replace(str(scratch.resolve()), WORKDIR).replace(str(scratch), WORKDIR)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


#: What differs from one run to the next: a date and time, a run name's time stamp.
_VOLATILE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d|\d{8}-\d{6}|\b\d\d:\d\d:\d\d\b")


def same(a: str, b: str) -> bool:
    """Whether two outputs are the same but for their times."""
    return _VOLATILE.sub("T", a) == _VOLATILE.sub("T", b)


def blocks(page: str) -> dict[str, str]:
    """The output blocks of docs/``page``: key -> the block's text."""
    return {m["key"]: m["body"] for m in MARKER.finditer((DOCS / page).read_text(encoding="utf-8"))}


def markers() -> dict[str, str]:
    """Every output marker of the docs: key -> the page (relative to docs/) that holds it."""
    found = {}
    for path in sorted(DOCS.rglob("*.md")):
        for key in blocks(str(path.relative_to(DOCS))):
            found[key] = str(path.relative_to(DOCS))
    return found


def write(key: str, body: str) -> bool:
    """Put ``body`` into the block of ``key``; whether the page changed."""
    path = DOCS / OUTPUTS[key].page
    text = path.read_text(encoding="utf-8")
    new = MARKER.sub(lambda m: m.group(0)[:m.start("body") - m.start()] + body + "```\n" if m["key"] == key
                     else m.group(0), text)
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=sorted(OUTPUTS), action="append", help="this output only (repeatable)")
    ap.add_argument("--check", action="store_true", help="compare the quick outputs, write nothing; exit 1 if stale")
    args = ap.parse_args(argv)
    missing = sorted(set(OUTPUTS) - set(markers()))
    if missing:
        print(f"docs/gen_outputs.py: no marker for {', '.join(missing)} on its page", file=sys.stderr)
        return 1
    keys = args.only or [k for k, o in OUTPUTS.items() if o.quick or not args.check]
    stale = []
    for key in keys:
        body = run(key)
        if args.check:
            if not same(blocks(OUTPUTS[key].page)[key], body):
                stale.append(f"docs/{OUTPUTS[key].page} ({key})")
        elif write(key, body):
            print(f"wrote docs/{OUTPUTS[key].page} ({key})")
    if stale:
        print("stale: " + ", ".join(stale) + "; run python docs/gen_outputs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
