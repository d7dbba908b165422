"""The commands and code of the docs site's tutorials, read by the tests that run them.

A tutorial's fenced block whose first line is ``# run by tests/.../test_x.py ...`` holds
commands that test runs (at its own small scale: it appends its own ``--model_dir``, steps and
thread settings, which argparse takes over the earlier ones). The test reads them here, so
the page and the test cannot part: a command edited on the page is the command the test runs,
and a block the test no longer finds fails it. ``# test`` blocks are another thing: they run
whole, as written (tests/integration/test_wheel_install.py).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def blocks(page: str, lang: str = "sh") -> list[str]:
    """Every fenced ``lang`` block of docs/``page``, dedented, as it reads."""
    text = (DOCS / page).read_text(encoding="utf-8")
    found = []
    for m in re.finditer(rf"^( *)```{lang}\n(.*?)^ *```", text, re.S | re.M):
        indent = len(m.group(1))
        found.append("".join(line[indent:] if line[:indent].isspace() else line
                             for line in m.group(2).splitlines(keepends=True)))
    return found


def block(page: str, first_line: str, lang: str = "sh") -> str:
    """The one ``lang`` block of docs/``page`` whose first line starts with ``first_line``."""
    found = [b for b in blocks(page, lang) if b.startswith(first_line)]
    assert len(found) == 1, f"docs/{page}: {len(found)} {lang} blocks start with {first_line!r}, expected 1"
    return found[0]


def commands(page: str, test_file: str, paths: dict[str, Path] | None = None) -> list[list[str]]:
    """The commands of the sh block of docs/``page`` that ``test_file`` runs (its first line
    is ``# run by test_file``): one argv per command, continuation lines joined, comments
    dropped. ``paths`` maps a path on the page (``inventory/mycluster``, or a prefix such as
    ``data/``) to where the test holds it."""
    return argvs(block(page, f"# run by {test_file}"), paths)


def steps(page: str, test_file: str) -> list[str]:
    """Every sh block of docs/``page`` that ``test_file`` runs, in the page's order: a
    tutorial whose steps are several blocks (``# run by test_file (step 1: ...)``, ...)."""
    return [b for b in blocks(page) if b.startswith(f"# run by {test_file}")]


def argvs(text: str, paths: dict[str, Path] | None = None) -> list[list[str]]:
    """The commands of a block's text: one argv per command, continuation lines joined,
    comments dropped; ``paths`` as for :func:`commands`."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            found.append([_mapped(a, paths or {}) for a in argv])
    return found


def _mapped(arg: str, paths: dict[str, Path]) -> str:
    """``arg`` with a path of the page replaced by the test's: ``inventory/mycluster`` exactly,
    or anything under ``data/`` (a prefix ending in ``/``)."""
    for prefix, where in paths.items():
        if arg in (prefix, prefix.rstrip("/")):
            return str(where) + ("/" if arg.endswith("/") else "")
        if prefix.endswith("/") and arg.startswith(prefix):
            return f"{where}/{arg[len(prefix):]}"
    return arg


def tfps_args(page: str, test_file: str, command: str, paths: dict[str, Path] | None = None) -> list[str]:
    """The arguments after ``tfps COMMAND`` of the page's one ``tfps COMMAND ...`` line in that block."""
    found = [argv[2:] for argv in commands(page, test_file, paths) if argv[:2] == ["tfps", command]]
    assert len(found) == 1, f"docs/{page}: {len(found)} `tfps {command}` lines in the block {test_file} runs"
    return found[0]
