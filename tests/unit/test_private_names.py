"""No module but tfps/compat/ touches a private attribute of another library's object.

Not a list of known internals: any ``obj._name`` outside compat/ whose ``_name`` tfps does
not define itself (a method, a class, a module-level name, an attribute set on ``self`` or
``cls``, a parameter) is an offence. A new internal of TensorFlow, tf_keras or Ansible used
anywhere else is found the day it is written, and moves into compat/ as a named accessor
that ``compat.check_tensorflow()`` / ``check_tf_keras()`` can vouch for.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "tfps"
#: Private names that are documented public API of the standard library.
STDLIB_PUBLIC = {"_exit"}   # os._exit
#: tfps's own private attributes, set on objects of other libraries.
OWN_ON_FOREIGN = {"_tfps"}   # tfps.logs marks its logging handler


def _sources(root: Path) -> list[Path]:
    # The Ansible plugins run inside ansible-core and use its API as its own plugins do.
    return sorted(p for p in root.rglob("*.py") if "ansible" not in p.relative_to(root).parts)


def own_private_names(files: list[Path]) -> set[str]:
    """The private names tfps defines itself."""
    own: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                own.add(node.attr)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif isinstance(node, ast.alias):
                own.add(node.asname or node.name.split(".")[0])
    return {name for name in own if name.startswith("_")}


def foreign_private_uses(files: list[Path], own: set[str], root: Path) -> list[str]:
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and node.attr not in own | STDLIB_PUBLIC | OWN_ON_FOREIGN):
                found.append(f"{path.relative_to(root)}:{node.lineno} .{node.attr}")
    return found


def test_no_module_but_compat_touches_a_private_attribute_of_another_library():
    files = _sources(PACKAGE)
    outside = [p for p in files if PACKAGE / "compat" not in p.parents]
    offences = foreign_private_uses(outside, own_private_names(files), REPO)
    assert offences == [], "move these into tfps/compat/ as named accessors:\n" + "\n".join(offences)


def test_the_guard_sees_a_private_attribute_it_was_never_told_of(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mine.py").write_text(
        "class Mine:\n"
        "    def __init__(self):\n"
        "        self._count = 0\n"
        "    def _bump(self, other):\n"
        "        other._count += 1          # tfps's own attribute, on another Mine: fine\n"
        "        return other._bump\n")
    (pkg / "bad.py").write_text(
        "import os\n"
        "def f(model, opt):\n"
        "    os._exit(0)                     # documented standard library: fine\n"
        "    opt._brand_new_internal = None  # set on a foreign object\n"
        "    return model._layers_by_depth   # read from one\n")
    files = _sources(pkg)
    found = foreign_private_uses(files, own_private_names(files), tmp_path)
    assert found == ["pkg/bad.py:4 ._brand_new_internal", "pkg/bad.py:5 ._layers_by_depth"]
