"""The role's defaults are tfps's own, checked in full against RunConfig.

``defaults/main.yml`` repeats, for Ansible users, the defaults ``tfps local`` and compose
take from :class:`tfps.config.RunConfig`. Every job setting is compared here, not a
sample: a default changed in one place and not the other fails this test.
"""

from __future__ import annotations

import dataclasses

import yaml

from tfps.cluster.variables import ARGUMENT_SPECS, DEFAULTS, RUN_FIELDS, launch_from_vars
from tfps.config import RunConfig

#: Role defaults that differ from RunConfig's on purpose, and why.
DIFFERENT_ON_PURPOSE = {
    # Containers, labels and the host's job directory are named after the job.
    "tfps_job_name": "train",
    # A directory on the chief's host, named after the job, not one relative to a checkout.
    "tfps_model_dir": "/srv/tfps/{{ tfps_job_name }}",
}


def _runconfig_default(name: str):
    field = next(f for f in dataclasses.fields(RunConfig) if f.name == name)
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def test_every_job_setting_of_the_role_has_tfps_s_default_or_says_why_not():
    defaults = yaml.safe_load(DEFAULTS.read_text())
    options = yaml.safe_load(ARGUMENT_SPECS.read_text())["argument_specs"]["main"]["options"]
    assert set(RUN_FIELDS) <= set(defaults) and set(RUN_FIELDS) <= set(options)
    differ = {}
    for var, field in RUN_FIELDS.items():
        role, own = defaults[var], _runconfig_default(field)
        blank = role is None or role == "" or role == {}   # the role leaves it to tfps
        if not (blank or role == own):
            differ[var] = role
    assert differ == DIFFERENT_ON_PURPOSE


def test_a_job_of_the_role_s_defaults_is_tfps_s_default_job():
    """The RunConfig the plan makes of the defaults (as rendered: the job name substituted)
    equals RunConfig() in every field but the job's name and directories."""
    defaults = yaml.safe_load(DEFAULTS.read_text())
    rendered = {**defaults, "tfps_model_dir": "/srv/tfps/train"}
    cfg, _ = launch_from_vars(rendered)
    own = RunConfig()
    mine = {"run_name", "model_dir", "export_dir"}

    def value(c: RunConfig, name: str):
        v = getattr(c, name)
        return None if v == {} else v   # no builder arguments, given as {} or not at all

    differing = {f.name for f in dataclasses.fields(RunConfig)
                 if f.name not in mine and value(cfg, f.name) != value(own, f.name)}
    assert differing == set(), {name: (getattr(cfg, name), getattr(own, name)) for name in differing}
    assert (cfg.run_name, cfg.model_dir, cfg.export_dir) == ("train", "/srv/tfps/train", "/srv/tfps/train/export")
