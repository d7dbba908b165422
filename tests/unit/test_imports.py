"""No import cycle inside tfps, counting imports inside functions (an AST check)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tfps"


def _graph() -> dict[str, set[str]]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from pkg import mod`` depends on pkg.mod; ``from mod import name`` on mod
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
                targets = subs or [node.module]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


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


def test_no_module_of_tfps_imports_itself_back():
    graph = _graph()
    assert len(graph) > 40 and "tfps.launch.processes" in graph["tfps.cli"]   # function-level imports count
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


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
