"""The project's wheel, as ``pip wheel`` builds it, for the tests that install tfps like a user.

:func:`wheel` builds it once per version of the sources and keeps it: the package's files
(``tfps/`` without the collections a checkout installs there), pyproject.toml, README.md
and LICENSE are copied to a scratch directory (the build writes its ``build/`` and
``*.egg-info`` there, never into the checkout), hashed, and built with ``pip wheel
--no-deps`` into ``$TFPS_TEST_CACHE`` (default ``~/.cache/tfps-tests``)``/wheel-HASH/``.
Another test, or another run, with the same sources takes that file (about 10 s saved a
build). A build is written to a temporary directory and renamed into place, so concurrent
test runs never see half a wheel. ``TFPS_TEST_WHEEL=FILE`` tests that wheel instead.

:func:`venv` installs it into a fresh venv that reaches TensorFlow, ansible-core and the
rest through a .pth file to this venv's site-packages (nothing is downloaded); tfps itself
is the wheel's copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SITE = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
#: What pip wheel reads besides the package.
TOP_FILES = ("pyproject.toml", "README.md", "LICENSE")


@dataclass(frozen=True)
class Wheel:
    path: Path
    build_log: str   # pip's stderr when it was built (kept with the wheel)


def _sources() -> list[Path]:
    files = [REPO / name for name in TOP_FILES]
    for path in sorted((REPO / "tfps").rglob("*")):
        rel = path.relative_to(REPO).parts
        if path.is_file() and "__pycache__" not in rel and rel[:3] != ("tfps", "ansible", "collections") \
                and path.suffix != ".pyc":
            files.append(path)
    return files


def _cache() -> Path:
    return Path(os.environ.get("TFPS_TEST_CACHE") or Path.home() / ".cache" / "tfps-tests")


def wheel() -> Wheel:
    """The wheel of the checkout's current sources, built now or taken from the cache; or the
    one ``$TFPS_TEST_WHEEL`` names (a CI's build artifact, or a wheel of a committed version)."""
    given = os.environ.get("TFPS_TEST_WHEEL")
    if given:
        path = Path(given).resolve()
        if not path.is_file():
            raise RuntimeError(f"TFPS_TEST_WHEEL={given} is not a file")
        return Wheel(path, "")
    files = _sources()
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    home = _cache() / f"wheel-{digest.hexdigest()[:16]}"
    found = sorted(home.glob("tfps-*.whl")) if home.is_dir() else []
    if found:
        log = home / "build.log"
        return Wheel(found[0], log.read_text() if log.exists() else "")
    home.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="tfps-wheel-", dir=home.parent))
    try:
        src = scratch / "src"
        for f in files:
            target = src / f.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
        build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q",
                                "--disable-pip-version-check", "-w", str(scratch / "dist")],
                               capture_output=True, text=True, timeout=600)
        if build.returncode != 0:
            raise RuntimeError(f"pip wheel failed ({build.returncode}):\n{build.stderr[-3000:]}")
        (scratch / "dist" / "build.log").write_text(build.stderr)
        try:
            os.rename(scratch / "dist", home)
        except OSError:   # another run built the same sources meanwhile: take its wheel
            if not any(home.glob("tfps-*.whl")):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return wheel()


def venv(where: Path, python: str = sys.executable, runner=None) -> Path:
    """A fresh venv at ``where`` with the wheel installed; its python.

    ``runner(argv)`` runs a command where the venv lives (default: here, with subprocess);
    the Slurm harness passes one that runs it inside a container, where ``where`` is on the
    shared volume and ``python`` and this venv's site-packages are mounted at the same paths.
    """
    w = wheel()

    def here(argv: list[str]) -> None:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({proc.returncode}): {proc.stderr[-2000:]}")

    run = runner or here
    run([python, "-m", "venv", "--without-pip", str(where)])
    run(["sh", "-c", f"echo {SITE} > {where}/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages/"
                     "project-venv.pth"])
    run([f"{where}/bin/python", "-m", "pip", "install", "-q", "--no-deps",
         "--disable-pip-version-check", str(w.path)])
    return where / "bin" / "python"
