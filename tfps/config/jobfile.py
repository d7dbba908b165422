"""``--config`` job files (YAML ``option: value``) and the YAML scalars of ``--model_arg``."""

from __future__ import annotations

from tfps.errors import ConfigError


def yaml_scalar(value) -> str:
    """A value as the YAML scalar that :func:`parse_model_args` reads back to the same value."""
    import yaml
    for kind in (bool, int, float, str):   # plain types: an inventory's values are subclasses of them
        if isinstance(value, kind):
            value = kind(value)
            break
    return yaml.safe_dump(value, default_flow_style=True, width=10**9).strip().removesuffix("...").strip()


#: The largest job file: a job file is some option: value lines (paths, not data).
MAX_JOB_FILE_BYTES = 1 << 20
#: The most values a job file may stand for once its YAML aliases are expanded: a 319-byte file
#: of anchors nested in each other ("billion laughs") stands for 10**9 and exhausts memory in
#: whatever walks it (the flags made of a list, a message quoting it).
MAX_JOB_FILE_VALUES = 10_000
#: The deepest nesting of a job file's values (an option's value is a scalar, a list or a mapping).
MAX_JOB_FILE_DEPTH = 20


def load_job_file(path: str, field: str = "config") -> dict:
    """A ``--config`` job file (``tfps local/run/compose/slurm --config``, the role's
    ``tfps_config``): a YAML mapping of option: value; anything else is one clear line
    (about ``field``), and so is a file too large, not UTF-8, or whose aliases stand for more
    than :data:`MAX_JOB_FILE_VALUES` values."""
    import yaml
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_JOB_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read {path} ({e.strerror}); give a YAML file of option: value lines",
                          field) from None
    if len(raw) > MAX_JOB_FILE_BYTES:
        raise ConfigError(f"{path} is larger than {MAX_JOB_FILE_BYTES} bytes; a job file is option: value lines "
                          "(name data files by their paths, not inline)", field)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); save it "
                          "as UTF-8", field) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{path} is not valid YAML{where}; give option: value lines", field) from None
    except RecursionError:
        data = _TOO_DEEP
    _check_expansion(path, data, field)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a {type(data).__name__}; give a mapping of option: value lines, "
                          "e.g. train_steps: 1000", field)
    return data


_TOO_DEEP = object()


def _check_expansion(path: str, data, field: str) -> None:
    """Refuse data nested too deep (or recursive) or standing for too many values.

    YAML aliases make one object appear in many places; each is counted once per place (the
    count of each object is kept, so the walk itself stays small)."""
    sizes: dict[int, int] = {}

    def size(value, depth: int) -> int:
        if depth > MAX_JOB_FILE_DEPTH or value is _TOO_DEEP:
            raise ConfigError(f"{path} nests values deeper than {MAX_JOB_FILE_DEPTH} levels (or an alias holds "
                              "itself); give option: value lines", field)
        if not isinstance(value, (dict, list)):
            return 1
        if id(value) not in sizes:
            items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            total = 1
            for item in items:
                total += size(item, depth + 1)
                if total > MAX_JOB_FILE_VALUES:
                    raise ConfigError(f"{path} stands for more than {MAX_JOB_FILE_VALUES} values once its YAML "
                                      "aliases (*name) are expanded; write the options out instead of nesting "
                                      "anchors in each other", field)
            sizes[id(value)] = total
        return sizes[id(value)]

    size(data, 0)


def did_you_mean(key, options) -> str:
    """``"; did you mean train-steps?"`` for a job file's unknown key, or nothing."""
    import difflib
    close = difflib.get_close_matches(str(key).replace("-", "_"), list(options), n=1)
    return f"; did you mean {close[0].replace('_', '-')}?" if close else ""
