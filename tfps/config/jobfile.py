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


def load_job_file(path: str, field: str = "config") -> dict:
    """A ``--config`` job file (``tfps local/run/compose/slurm --config``, the role's
    ``tfps_config``): a YAML mapping of option: value; anything else is one clear line
    (about ``field``)."""
    import yaml
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as e:
        raise ConfigError(f"cannot read {path} ({e.strerror}); give a YAML file of option: value lines",
                          field) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"{path} is not valid YAML{where}; give option: value lines", field) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a {type(data).__name__}; give a mapping of option: value lines, "
                          "e.g. train_steps: 1000", field)
    return data


def did_you_mean(key, options) -> str:
    """``"; did you mean train-steps?"`` for a job file's unknown key, or nothing."""
    import difflib
    close = difflib.get_close_matches(str(key).replace("-", "_"), list(options), n=1)
    return f"; did you mean {close[0].replace('_', '-')}?" if close else ""
