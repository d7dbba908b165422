"""Every run-time patch of another library is registered in tfps.compat.patches and checked.

A run-time patch is code that changes another library's code or state for the whole process:
an attribute assigned on a module or class tfps imported (``os._exit = ...``), a
``setattr`` on one, an entry written into ``sys.modules``, a pointer written through ctypes
(``from_address(...).value = ...``, ``memmove``), a graph collection of TensorFlow's emptied.
A new TensorFlow can break any of them silently, so each one is named (``PATCHES``), applied
only in its registered module, and checked at every task's start (``check_patches``).
"""

from __future__ import annotations

import ast
import importlib
import os
from pathlib import Path

import pytest

from tfps import compat
from tfps.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "tfps"


def _imported_names(tree: ast.AST) -> set[str]:
    """Names a module binds by importing something that is not tfps's own."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if not a.name.startswith("tfps")}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith("tfps") and not node.level:
            names |= {a.asname or a.name for a in node.names}
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
              and ast.unparse(node.value.func).endswith("import_module")):   # module = importlib.import_module(...)
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


#: Process state that Python documents for programs to set: not a patch of a library.
DOCUMENTED_HOOKS = {"sys.argv", "threading.excepthook", "sys.excepthook"}


def patches_in(path: Path, root: Path) -> list[str]:
    """Where ``path`` patches another library at run time: ``file:line what``."""
    tree = ast.parse(path.read_text(), str(path))
    foreign = _imported_names(tree)
    found = []

    def hit(node, what):
        found.append(f"{path.relative_to(root)}:{node.lineno} {what}")

    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else \
            node.targets if isinstance(node, ast.Delete) else []
        for t in targets:
            base = _root(t)
            if isinstance(t, ast.Attribute) and ast.unparse(t) in DOCUMENTED_HOOKS:
                continue
            if isinstance(t, ast.Attribute) and any(isinstance(n, ast.Call) and getattr(n.func, "attr", "")
                                                    == "from_address" for n in ast.walk(t)):
                hit(node, "writes memory through ctypes")
            elif isinstance(t, ast.Attribute) and isinstance(base, ast.Name) and base.id in foreign:
                hit(node, f"assigns {ast.unparse(t)}")
            elif isinstance(t, ast.Subscript) and ast.unparse(t.value) == "sys.modules":
                hit(node, "writes sys.modules")
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in ("setattr", "delattr") and node.args and isinstance(_root(node.args[0]), ast.Name) \
                    and _root(node.args[0]).id in foreign:
                hit(node, f"{name}({ast.unparse(node.args[0])}, ...)")
            elif name.endswith(("ctypes.memmove", "ctypes.memset")):
                hit(node, "writes memory through ctypes")
            elif name.endswith(".clear_collection"):
                hit(node, "empties a graph collection")
    return sorted(found, key=lambda f: int(f.split(":")[1].split(" ")[0]))


def _all_patches(package: Path = PACKAGE) -> list[str]:
    # The Ansible plugins run inside ansible-core as its own plugins do.
    return [p for path in sorted(package.rglob("*.py")) if "ansible" not in path.relative_to(package).parts
            for p in patches_in(path, package.parent)]


def test_every_patch_is_applied_where_compat_names_it():
    sites = {p.site for p in compat.PATCHES}
    unregistered = [p for p in _all_patches() if p.split(":")[0] not in sites]
    assert unregistered == [], ("register these run-time patches in tfps/compat/patches.py (PATCHES, with a "
                                "check in _patch_misfits), or move them there:\n" + "\n".join(unregistered))


def test_every_registered_site_still_applies_a_patch():
    """Outside tfps/compat/ (whose patches are its own functions, read there)."""
    applied = {p.split(":")[0] for p in _all_patches()}
    stale = [f"{p.name} ({p.site})" for p in compat.PATCHES
             if p.site not in applied and not p.site.startswith("tfps/compat/")]
    assert stale == [], "PATCHES names sites that patch nothing any more: " + ", ".join(stale)


def test_the_finder_sees_a_planted_patch(tmp_path):
    pkg = tmp_path / "tfps"
    pkg.mkdir()
    (pkg / "mine.py").write_text(
        "import sys, ctypes\n"
        "import tensorflow as tf\n"
        "from tf_keras import layers\n"
        "from tfps.task import worker\n"
        "class Mine:\n"
        "    def __init__(self):\n"
        "        self.count = 0\n"
        "def f(graph, args):\n"
        "    args.model_dir = 'x'                       # a local object: fine\n"
        "    worker.SOMETHING = 1                        # tfps's own module: fine\n"
        "    tf.compat.v1.train.Saver.save = None        # patch\n"
        "    setattr(layers.Dense, 'call', None)         # patch\n"
        "    sys.modules['keras'] = None                 # patch\n"
        "    ctypes.c_void_p.from_address(8).value = 0   # patch\n"
        "    graph.clear_collection('summaries')         # patch\n")
    found = _all_patches(pkg)
    assert [f.split(" ", 1)[0] for f in found] == [f"tfps/mine.py:{n}" for n in (11, 12, 13, 14, 15)], found
    assert all(f.split(":")[0] not in {p.site for p in compat.PATCHES} for f in found)


# ----------------------------------------------------------------------- the start-up check
tf = pytest.importorskip("tensorflow")


def test_every_patch_fits_this_tensorflow():
    compat.check_patches()


def test_a_patch_that_no_longer_fits_is_one_line(monkeypatch):
    ops = importlib.import_module("tensorflow.python.ops.critical_section_ops")   # the patch's target
    monkeypatch.setattr(ops, "CRITICAL_SECTIONS", "critical_sections_v2")
    with pytest.raises(ConfigError) as e:
        compat.check_tensorflow()
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("tfps's run-time patch critical-section-collections (tfps/compat/patches.py) "
                              "no longer fits:")
    assert f"checked on TensorFlow {compat.TENSORFLOW_VERSION}" in message


def test_a_replaced_os_exit_left_behind_is_found(monkeypatch):
    monkeypatch.setattr(os, "_exit", lambda code: None)
    with pytest.raises(ConfigError, match=r"run-time patch user-code-exit \(tfps/errors.py\) no longer fits"):
        compat.check_patches()


def test_the_collections_emptied_are_tensorflows():
    g = tf.Graph()
    with g.as_default():
        lock = tf.CriticalSection(name="lock")
        lock.execute(lambda: tf.constant(1))
        assert g.get_collection("critical_sections") and g.get_collection("critical_section_executions")
        compat.clear_critical_section_collections(g)
        assert g.get_collection("critical_sections") == [] == g.get_collection("critical_section_executions")
