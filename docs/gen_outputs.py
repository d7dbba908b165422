"""Write the output the tutorials show from real runs of their own commands.

A tutorial shows what a command prints in a fenced ``text`` block right under a marker line::

    <!-- output: first-job (written by `make docs-outputs` from a real run; do not edit) -->

``python docs/gen_outputs.py`` (``make docs-outputs``) runs each command of ``OUTPUTS``
as the page gives it, in a scratch directory (``tfps`` being this checkout's), and writes
what it printed into that block, the scratch directory's path shown as ``/srv/ml``. ``--only
KEY`` runs one; ``--check`` runs the quick ones (``quick=True``: no training) and exits 1,
naming each page whose block is stale, instead of writing. tests/unit/test_docs_outputs.py
checks that every marker names an output and every output has its marker;
tests/integration/test_docs_quick_outputs.py that the quick outputs are current; and
tests/integration/test_async_job.py that the first job's block has the lines a real run of
its command prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
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
}


def run(key: str) -> str:
    """The block of output ``key``: its commands run in a scratch directory, the scratch path taken out."""
    out = OUTPUTS[key]
    scratch = Path(tempfile.mkdtemp(prefix="tfps-docs-"))
    try:
        if out.inventory:
            shutil.copytree(REPO / "inventory" / "example", scratch / "inventory" / "mycluster")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               "COLUMNS": "120", "TF_CPP_MIN_LOG_LEVEL": "2"}
        env.pop("APPRISE_URLS", None)
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
