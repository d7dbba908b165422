"""tfps's modules import in layers, with no import cycle (an AST check).

Every import counts: those inside functions, and the package ``__init__`` files an import
runs (``from tfps.task.graph import optimizers`` runs ``tfps/task/__init__.py`` first, and what
it imports).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tfps"

#: tfps's layers, lowest first: a module imports only modules of its own layer and of the
#: layers below it. ``tfps`` is the package's own ``__init__``; a name stands for a module
#: or a whole subpackage. docs/design/layers.md says why the order is this one.
LAYERS = [
    "tfps tfps.errors tfps.names tfps.timeouts tfps.exitcodes tfps.logs tfps.compat tfps.jsonfile tfps.playbooks",
    "tfps.data",
    "tfps.config",
    "tfps.models tfps.layers",
    "tfps.cluster",
    "tfps.outcome",
    "tfps.notify",
    "tfps.task",
    "tfps.launch",
    "tfps.backends",
    "tfps.cli tfps.cli_ansible tfps.cli_tools tfps.__main__",
    # The role's controller-side plugins (action, filter, lookup): they run inside ansible-core on the
    # controller, where tfps is installed, and may use any of it; nothing of tfps imports them.
    "tfps.ansible",
]
#: The role's plugins that run inside ansible-core on the controller, as modules of the top layer.
ROLE = PACKAGE / "ansible" / "roles" / "tfps"
CONTROLLER_PLUGINS = ("action_plugins", "filter_plugins", "lookup_plugins")
#: The role's modules that Ansible copies to each host, where tfps is not installed.
HOST_MODULES = ("library", "module_utils")

#: Imports against the order, each with the reason it still stands: (importer, imported) -> why.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

#: Downward imports the contract forbids all the same: (importer, imported), each a module or a
#: whole subpackage. The launchers and the role's plugins plan memory with tfps.cluster.memory
#: (pure Python), never with a task's modules.
FORBIDDEN = [("tfps.launch", "tfps.task"), ("tfps.ansible", "tfps.task")]
#: The launchers' modules that still import ``tfps.task``, each with why: they run a task or
#: build its graph. Adding one to this list is a design decision, not a fix.
ALLOWED_FORBIDDEN: dict[str, str] = {
    "tfps.launch.tasks": "tfps local's forked task runs the task's entry (tfps.task.entry.main)",
    "tfps.launch.slurm_step": "one task of tfps slurm's srun step runs the task's entry",
    "tfps.launch.estimate": "the memory estimate builds the training graph with the worker's own code",
    "tfps.launch.processes": "tfps local checks the model and data (JobSetup) and shares the stop window",
}


#: tfps.task's rooms (one concern each) and its roles (the processes a task is, at the package's top).
TASK_ROOMS = ("graph", "runtime", "net", "output", "monitor")
TASK_ROLES = ("entry", "worker", "chief", "ps", "feeder")
#: Inside tfps.task: the rooms serve the roles and never import them; the network guards stand
#: alone (a classic script's guard runs with nothing else of tfps.task); what the chief leaves
#: (output: checkpoints, the export from a fresh local graph) never imports the training graph,
#: the process's runtime or the monitor; the process's runtime never imports the graph or the
#: monitor (it uses only the guards and the checkpoints' names).
TASK_FORBIDDEN = ([(f"tfps.task.{room}", f"tfps.task.{role}") for room in TASK_ROOMS for role in TASK_ROLES]
                  + [("tfps.task.net", f"tfps.task.{other}") for other in (*TASK_ROOMS, *TASK_ROLES, "setup")
                     if other != "net"]
                  + [("tfps.task.output", f"tfps.task.{other}") for other in ("graph", "runtime", "monitor", "setup")]
                  + [("tfps.task.runtime", f"tfps.task.{other}") for other in ("graph", "monitor", "setup")])


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imported(node: ast.AST, name: str, is_package: bool, modules) -> list[str]:
    """The modules the statement or call ``node`` of module ``name`` names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:   # relative: from the module's package
            package = name.split(".") if is_package else name.split(".")[:-1]
            base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
        # ``from pkg import mod`` imports pkg.mod; ``from mod import name`` imports mod
        return [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
    if (isinstance(node, ast.Call) and node.args and getattr(node.func, "attr", getattr(node.func, "id", None))
            == "import_module"):
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return [arg.value]
        if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
            prefix = arg.values[0].value   # f"tfps.notify.{name}": any module under that prefix
            return [m for m in modules if m.startswith(prefix)]
    return []


def _graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of the package that importing it may import, at once or later
    (in a function): each imported module and every package ``__init__`` on its way, except
    the module's own packages (they are loaded before it)."""
    modules = {}
    for path in package.rglob("*.py"):
        if (package / "ansible") in path.parents:   # package data, not modules: only the controller plugins count
            if not any(package / "ansible" / "roles" / "tfps" / kind == path.parent for kind in CONTROLLER_PLUGINS):
                continue
        name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        own = {name, *_ancestors(name)}
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _imported(node, name, path.name == "__init__.py", modules):
                graph[name].update(m for m in (*_ancestors(target), target) if m in modules and m not in own)
    return graph


def _layer(module: str) -> int:
    """The index in LAYERS of the longest name that is ``module`` or one of its packages."""
    found = [(len(n), i) for i, names in enumerate(LAYERS) for n in names.split()
             if module == n or module.startswith(n + ".")]
    assert found, f"{module} is in no layer: add it to LAYERS in {Path(__file__).name}"
    return max(found)[1]


def _allowed(a: str, b: str) -> bool:
    """Whether ALLOWED_UPWARD lets ``a`` import ``b``, or a package ``__init__`` on the way to an allowed module."""
    return any(a == x and (b == y or y.startswith(b + ".")) for x, y in ALLOWED_UPWARD)


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} (layer {LAYERS[_layer(a)].split()[0]}) imports {b} (layer {LAYERS[_layer(b)].split()[0]})"
            for a in sorted(graph) for b in sorted(graph[a])
            if _layer(b) > _layer(a) and not _allowed(a, b)]


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_checker_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_counts_package_inits_and_imports_in_functions(tmp_path):
    """A loop of the kind tfps had: config imported a name from a subpackage whose
    ``__init__`` imports a module that imports config, in a function."""
    pkg = tmp_path / "p"
    (pkg / "task").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "config.py").write_text("from p.task import names\n")
    (pkg / "task" / "__init__.py").write_text("def run():\n    from . import worker\n")
    (pkg / "task" / "names.py").write_text("import os\n")
    (pkg / "task" / "worker.py").write_text("import importlib\nimportlib.import_module('p.config')\n")
    graph = _graph(pkg)
    assert graph == {"p": set(), "p.config": {"p.task", "p.task.names"}, "p.task": {"p.task.worker"},
                     "p.task.names": set(), "p.task.worker": {"p.config"}}
    assert _cycle(graph) == ["p.config", "p.task", "p.task.worker", "p.config"]


def test_no_module_of_tfps_imports_itself_back():
    graph = _graph()
    assert len(graph) > 40 and "tfps.task.entry" in graph["tfps.cli"]   # function-level imports count
    assert "tfps.task.worker" in graph["tfps.task"]   # so do package __init__ files
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_every_module_imports_only_its_own_layer_and_those_below():
    graph = _graph()
    assert _upward(graph) == []
    for (a, b), why in ALLOWED_UPWARD.items():   # an allowance goes when its import does
        assert b in graph[a], f"{a} no longer imports {b}: remove its entry from ALLOWED_UPWARD ({why})"
    assert _upward({"tfps.cluster.settings": {"tfps.outcome.results"}}) == [
        "tfps.cluster.settings (layer tfps.cluster) imports tfps.outcome.results (layer tfps.outcome)"]


def _forbidden(graph: dict[str, set[str]], rules=FORBIDDEN, allowed=ALLOWED_FORBIDDEN) -> list[str]:
    def under(module: str, name: str) -> bool:
        return module == name or module.startswith(name + ".")
    return [f"{a} imports {b}" for a in sorted(graph) for b in sorted(graph[a])
            for x, y in rules if under(a, x) and under(b, y) and a not in allowed]


def test_neither_the_launchers_nor_the_roles_plugins_import_a_tasks_modules():
    graph = _graph()
    assert _forbidden(graph) == [], "plan memory with tfps.cluster.memory, not tfps.task"
    for module, why in ALLOWED_FORBIDDEN.items():   # an allowance goes when its import does
        assert any(b.startswith("tfps.task") for b in graph[module]), \
            f"{module} no longer imports tfps.task: remove it from ALLOWED_FORBIDDEN ({why})"
    assert _forbidden({"tfps.ansible.roles.tfps.filter_plugins.tfps_filters": {"tfps.task.graph.placement"},
                       "tfps.launch.console": {"tfps.task", "tfps.cluster.memory"}}) == [
        "tfps.ansible.roles.tfps.filter_plugins.tfps_filters imports tfps.task.graph.placement",
        "tfps.launch.console imports tfps.task"]


def test_the_rooms_of_task_serve_its_roles_and_the_guards_and_outputs_stand_alone():
    graph = _graph()
    rooms = {m.split(".")[2] for m in graph if m.startswith("tfps.task.") and m.count(".") >= 3}
    assert rooms == set(TASK_ROOMS), "a new room of tfps.task: add it to TASK_ROOMS and say what it may import"
    assert _forbidden(graph, TASK_FORBIDDEN, {}) == []
    assert _forbidden({"tfps.task.graph.steps": {"tfps.task.worker"}, "tfps.task.net.loopback": {"tfps.task.runtime"},
                       "tfps.task.output.export": {"tfps.task.graph.model_step"},
                       "tfps.task.runtime.hooks": {"tfps.task.output.checkpoint", "tfps.task.monitor.progressive"}},
                      TASK_FORBIDDEN, {}) == [
        "tfps.task.graph.steps imports tfps.task.worker", "tfps.task.net.loopback imports tfps.task.runtime",
        "tfps.task.output.export imports tfps.task.graph.model_step",
        "tfps.task.runtime.hooks imports tfps.task.monitor.progressive"]


def test_the_roles_plugins_are_the_top_layer_and_host_modules_import_no_tfps():
    graph = _graph()
    filters = "tfps.ansible.roles.tfps.filter_plugins.tfps_filters"
    assert filters in graph and "tfps.cluster.datasrc" in graph[filters]   # the plugins are in the check
    assert not [a for a, bs in graph.items() if not a.startswith("tfps.ansible") and any(
        b.startswith("tfps.ansible.") for b in bs)]
    host_side = [f"{path.relative_to(PACKAGE)}: {n}" for kind in HOST_MODULES for path in sorted((ROLE / kind).glob("*.py"))
                 for node in ast.walk(ast.parse(path.read_text())) for n in _imported(node, "m", False, {})
                 if n == "tfps" or n.startswith("tfps.")]
    assert host_side == [], "a module Ansible runs on a host cannot import tfps (not installed there)"


def test_the_layer_page_shows_this_order():
    """docs/design/layers.md draws LAYERS: the names of each layer, lowest first, joined by ->."""
    text = (PACKAGE.parent / "docs" / "design" / "layers.md").read_text()
    drawing = " ".join(line for line in text.split("\n\n", 3)[2].splitlines() if line.startswith("    "))
    drawn = [[n.strip() for n in layer.split(",") if n.strip()] for layer in " ".join(drawing.split()).split("->")]
    want = [[n.removeprefix("tfps.") for n in names.split() if n != "tfps"] for names in LAYERS]
    assert drawn == want, "docs/design/layers.md's drawing differs from LAYERS in tests/unit/test_imports.py"


def test_the_names_config_checks_are_the_names_of_the_modules_above_it():
    from tfps import config, models
    from tfps.task.graph import optimizers
    assert tuple(models.BUILTIN) == config.BUILTIN_MODELS
    assert tuple(optimizers.CLASSES) == optimizers.NAMES == config.OPTIMIZERS


def test_one_entry_for_a_task_the_cli_and_forked_tasks_both_call():
    graph = _graph()
    assert "tfps.task.entry" in graph["tfps.cli"]
    assert "tfps.task.entry" in graph["tfps.launch.tasks"]
    assert "tfps.cli" not in graph["tfps.launch.tasks"]
    source = (PACKAGE / "launch" / "tasks.py").read_text()
    assert "task_entry.main(run_args)" in source and "argv[3:]" not in source


def test_the_task_entry_refuses_bad_flags_in_one_line(capsys):
    from tfps.exitcodes import ExitCode
    from tfps.task import entry
    code = entry.main(["--ps_hosts=a:1", "--worker_hosts=b:2", "--job_name=ps", "--task_index=0",
                       "--train-steps=-1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == ExitCode.BAD_CONFIG and err == ["tfps: error: train_steps: must be a positive integer, got -1"]
    assert entry.main(["--no_such_flag"]) == ExitCode.BAD_CONFIG


#: A function-level import of a tfps module says why it is not at the module's top, on its line
#: or the line before: ``# lazy: imports TensorFlow``, ``# lazy: cycle: ...``, ``# lazy: only tfps
#: plan needs it`` (a light module: the CLI, config, cluster, what ``tfps --help`` loads).
LAZY_REASON = re.compile(r"#\s*lazy:\s*\S")


def _unexplained_lazy_imports(package: Path = PACKAGE) -> list[str]:
    """``path:line: statement`` of each import of the package's own modules inside a function
    (or method) with no ``# lazy: <reason>`` on its first line or the line before."""
    found = set()
    for path in sorted(package.rglob("*.py")):
        if (package / "ansible") in path.parents:   # package data that ansible-core loads, not tfps's modules
            continue
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    own = any(a.name.split(".")[0] == package.name for a in node.names)
                elif isinstance(node, ast.ImportFrom):
                    own = bool(node.level) or (node.module or "").split(".")[0] == package.name
                else:
                    continue
                here, before = lines[node.lineno - 1], lines[node.lineno - 2] if node.lineno > 1 else ""
                if own and not LAZY_REASON.search(here) and not LAZY_REASON.match(before.strip()):
                    found.add(f"{path.relative_to(package.parent)}:{node.lineno}: {here.strip()}")
    return sorted(found, key=lambda s: (s.split(":")[0], int(s.split(":")[1])))


def test_every_function_level_import_of_tfps_says_why_it_is_not_at_the_top():
    """Move it to the module's top, or say why it cannot be there (``# lazy: <reason>``): TensorFlow's
    (or NumPy's, apprise's) import cost, a cycle, or the import time of a light module such as the CLI."""
    unexplained = _unexplained_lazy_imports()
    assert unexplained == [], "\n".join(["imports in a function without '# lazy: <reason>':", *unexplained])


def test_the_lazy_import_check_finds_a_planted_one(tmp_path):
    pkg = tmp_path / "tfps"
    (pkg / "task").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "task" / "__init__.py").write_text("")
    (pkg / "task" / "chief.py").write_text(
        "import json\n"
        "from tfps import errors\n"                              # at the top: fine
        "\n"
        "def run():\n"
        "    import tensorflow as tf\n"                          # not tfps: fine
        "    from tfps.task import export  # lazy: imports TensorFlow\n"
        "    # lazy: cycle with tfps.task\n"
        "    import tfps.task.worker\n"
        "    from tfps.task import hooks\n"                      # planted: no reason
        "\n"
        "class Chief:\n"
        "    def end(self):\n"
        "        from . import board  # lazy:\n"                 # planted: an empty reason
        "        import tfps.outcome, os  # noqa: E401\n")       # planted: a reason of another kind
    assert _unexplained_lazy_imports(pkg) == [
        "tfps/task/chief.py:9: from tfps.task import hooks",
        "tfps/task/chief.py:13: from . import board  # lazy:",
        "tfps/task/chief.py:14: import tfps.outcome, os  # noqa: E401"]
