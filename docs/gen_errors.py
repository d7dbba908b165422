"""Write docs/errors.md: every refusal of bad input tfps can print, read from the code.

Each ``raise ConfigError(message, field)`` in the package is one row: the field the
message names (``tfps: error: FIELD: message``), the message with its variable parts shown
as ``‹name›``, and where it is raised. A unit test keeps the file equal to this output, so
the table cannot fall behind the code. Run ``python docs/gen_errors.py`` after adding one.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "tfps"
OUT = REPO / "docs" / "errors.md"

HEAD = """# Errors: every refusal of bad input

Bad input of every kind (flags, data, models, inventories, URLs, directories) is refused
before anything starts, with one line on stderr and exit code 2:

    tfps: error: FIELD: what is wrong, and what to change

The table lists every such message in the code, generated from it by `docs/gen_errors.py`
(a unit test keeps it current). `‹...›` marks what the message fills in: a path, a value,
a line number. The exit codes are in [Exit codes](reference/exit-codes.md). A mistyped command line (an
unknown option, `--train_steps 1e20` where a whole number belongs) is refused the same way, in
one line naming the option, with `(see tfps COMMAND --help)`. `tests/unit/test_errors_catalogue.py`
makes rows of this table happen through the real command line and checks their lines.

Failures found after the start are not refusals. They end the job with exit code 1,
`results.json` (status `failed`, `error`, and `lost_tasks` when a task died), and the one
failure message: a task that dies and does not come back (the job ends within
`--sync_timeout`), a value that is not finite past the rows checked before the start, a
model whose variables turn NaN or infinite, a `--startup_timeout` that runs out, and a
disk that fills while the chief saves (a checkpoint, periodic or final, or the export), in
one line (shown here in two):

    the disk of /data/model is full (0 B free of 2.0 MiB) while writing the checkpoint of step 58,
    which needs about 12.3 MiB: free space there or give --model_dir on a larger disk

The chief removes what the failed save left (TensorFlow's `*.tempstate*` files and
`*_temp*/` directories, a half-written export) before it writes `results.json`; when even
that cannot be written, the line is still logged and the message still sent.

"""


def _name_of(expr: ast.AST) -> str:
    """A short name for what an f-string part fills in: its main variable or attribute."""
    if isinstance(expr, ast.IfExp):
        return _name_of(expr.body)
    if isinstance(expr, ast.Attribute):
        return expr.attr.strip("_")
    if isinstance(expr, ast.Call):
        return _name_of(expr.args[0]) if expr.args and isinstance(expr.func, ast.Name) else _name_of(expr.func)
    if isinstance(expr, ast.Name):
        return expr.id.strip("_")
    names = [n for n in ast.walk(expr) if isinstance(n, (ast.Name, ast.Attribute))]
    return _name_of(names[0]) if names else "value"


def _render(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_render(v) for v in node.values)
    if isinstance(node, ast.FormattedValue):
        return f"‹{_name_of(node.value)}›"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _render(node.left) + _render(node.right)
    return f"‹{ast.unparse(node)}›"


#: The exceptions whose raises are refusals (``tfps.errors``).
REFUSALS = ("ConfigError", "UserCodeExit")


def refusals() -> list[tuple[str, str, str]]:
    """(module path, field, message) of every ``raise ConfigError(...)`` in the package."""
    rows = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            call = node.exc
            # ConfigError and its subclass UserCodeExit (model code that tried to end the process).
            if not (isinstance(call.func, ast.Name) and call.func.id in REFUSALS) or not call.args:
                continue
            field = call.args[1] if len(call.args) > 1 else next(
                (k.value for k in call.keywords if k.arg == "field"), None)
            field_text = ("" if field is None else field.value if isinstance(field, ast.Constant)
                          else f"‹{ast.unparse(field)}›")
            rows.append((str(path.relative_to(REPO)), field_text, _render(call.args[0])))
    return rows


def render() -> str:
    lines = [HEAD, "| field | message | raised in |", "|---|---|---|"]
    for module, field, message in refusals():
        cell = " ".join(message.split()).replace("|", "\\|")
        lines.append(f"| {field or '(none)'} | {cell} | `{module}` |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"{OUT}: {len(refusals())} refusals", file=sys.stderr)
