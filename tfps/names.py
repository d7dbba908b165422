"""The names a user gives that end up in paths, lines and messages: --run_name, --model_dir.

A name is refused in one line when it would break what it names: a path separator in a run
name (it names one directory under runs/), a control character anywhere (a newline splits
every log line, results field and message that carries it), a name of white space only."""

from __future__ import annotations

import unicodedata

from tfps.errors import ConfigError

#: The longest --run_name: it names a directory (runs/NAME-TIME), files and messages.
MAX_RUN_NAME = 100


def check_run_name(name: str) -> None:
    """Refuse a run name that is not one plain file name (it becomes runs/NAME-TIME)."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if len(name) > MAX_RUN_NAME or size > 2 * MAX_RUN_NAME:
        raise ConfigError(f"is {len(name)} characters ({size} bytes) long; use at most {MAX_RUN_NAME} characters "
                          f"({2 * MAX_RUN_NAME} bytes)", "run_name")
    bad = next((ch for ch in name if ch in "/\\"), None) or _control_character(name)
    if bad is not None:
        what = "a path separator" if bad in "/\\" else f"a control character ({bad!r})"
        raise ConfigError(f"{name!r} holds {what}; a run name names one directory under runs/, so use "
                          "letters, digits and -_.=[] (e.g. exp-lr0.01)", "run_name")
    if name.strip() in (".", "..", ""):
        raise ConfigError(f"{name!r} is not a name; give the run a name of its own (e.g. exp-lr0.01)", "run_name")
    if name != name.strip():
        raise ConfigError(f"{name!r} starts or ends with white space; give the name without it (e.g. "
                          f"{name.strip()!r})", "run_name")


def _control_character(text: str) -> str | None:
    return next((ch for ch in text if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp")), None)


def check_directory_name(path: str, field: str) -> None:
    """Refuse a directory (--model_dir, --export_dir) that holds a control character (a newline
    would split every line that names it: logs, results, messages) or is only white space."""
    if not path.strip():
        raise ConfigError(f"{path!r} is only white space; name a directory for checkpoints and results (e.g. "
                          "runs/exp1)", field)
    bad = _control_character(path)
    if bad is not None:
        raise ConfigError(f"{path!r} holds a control character ({bad!r}); name the directory with printable "
                          "characters only (e.g. runs/exp1)", field)
