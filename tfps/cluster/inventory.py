"""A plan from Ansible's own view of an inventory.

Ansible is the authority on inventories: which hosts are in ``ps`` and ``worker``, in
which order, and what each host's variables are after every precedence rule (INI, YAML,
directories, scripts, inventory plugins, ``group_vars``/``host_vars`` beside the
inventory or the playbook, ``-e``, Vault). So tfps never parses an inventory itself:

* :func:`plan_from_view` computes the plan from what Ansible resolved: the ``groups``
  and each host's raw variables, templated with Ansible's own templar. The role's
  ``tfps_plan`` action calls it with the play's ``groups`` and ``hostvars``.
* :func:`load_plan` is ``tfps plan -i SOURCE ...``: it builds the same view with
  ansible-core's InventoryManager and VariableManager, exactly as ``ansible-inventory``
  does, and calls the same function. Both therefore give the same plan.

ansible-core is imported only here, and only when called (``pip install 'tfps[ansible]'``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tfps.cluster.plan import LAYOUT_VARS, PS, WORKER, Plan, Task, plan_from_hosts
from tfps.cluster.variables import DEFAULTS, JOB_VARS, check_names, job_file_vars, launch_from_vars
from tfps.compat import ansible_origin, check_ansible
from tfps.errors import ConfigError

#: The variables the plan reads; only these are templated (a vaulted notification URL
#: stays encrypted when no vault password is given).
PLAN_VARS = LAYOUT_VARS + JOB_VARS

Template = Callable[[Any, Mapping[str, Any]], Any]


def plain(value: Any) -> Any:
    """Ansible's tagged str/int/... as plain Python data (JSON and YAML ready)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return str(value)


def origin(value: Any) -> str | None:
    """Where Ansible read a value or a variable name (``file:line``), when it knows."""

    return ansible_origin(value)


def _resolve(host: str, raw: Mapping[str, Any], defaults: Mapping[str, Any], template: Template) -> dict:
    """The plan's variables of one host: role defaults under its own, templates rendered.

    A job file in ``tfps_config`` comes between the two: its settings replace the role's
    defaults, the host's own variables win over it (its extra flags come before theirs)."""
    merged = {**defaults, **raw}
    config = merged.get("tfps_config")
    if config not in (None, ""):
        path = str(plain(template(config, merged)))
        found = job_file_vars(path) if path.strip() else {}
        merged = {**defaults, **found, **raw}
        if "tfps_extra_args" in found and "tfps_extra_args" in raw:
            own = plain(template(raw["tfps_extra_args"], merged))
            merged["tfps_extra_args"] = found["tfps_extra_args"] + (own if isinstance(own, list) else [own])
    resolved = {}
    for name in PLAN_VARS:
        if name not in merged:
            continue
        value = merged[name]
        try:
            resolved[name] = plain(template(value, merged))
        except Exception as exc:  # noqa: BLE001 - Ansible raises many kinds; all mean "fix this value"
            where = origin(value) or origin(next((k for k in raw if k == name), name))
            text = " ".join(str(exc).split())
            hint = ("pass --vault-password-file or --vault-id, or keep the cluster layout and job settings in "
                    "plain text" if "vault" in text.lower() else "fix the value")
            raise ConfigError(f"host {host!r}{f' ({where})' if where else ''}: cannot resolve it: {text}; {hint}",
                              name) from None
    return resolved


def plan_from_view(
    groups: Mapping[str, Sequence[str]],
    host_vars: Mapping[str, Mapping[str, Any]],
    defaults: Mapping[str, Any],
    template: Template,
) -> dict:
    """The plan's JSON from Ansible's view: ``groups``, raw variables per host, role defaults.

    ``template(value, variables)`` renders a value as the play would. Unknown ``tfps_*``
    names are refused with the file and line that set them; job settings must be the
    same on every host of the job (the chief's host is the one that counts).
    """
    ps_hosts, worker_hosts = list(groups.get(PS) or []), list(groups.get(WORKER) or [])
    for job, hosts in ((PS, ps_hosts), (WORKER, worker_hosts)):
        if not hosts:
            raise _missing_group(job, groups)
    resolved: dict[str, dict] = {}
    for host in dict.fromkeys(ps_hosts + worker_hosts):
        raw = host_vars[host]
        names = {str(k): k for k in raw}
        check_names(list(names), f"host {host!r}", origin=lambda n, names=names: origin(names[n]))
        resolved[host] = _resolve(host, raw, defaults, template)
    try:
        plan = plan_from_hosts(ps_hosts, worker_hosts, resolved)
    except ConfigError as exc:
        raise _with_origin(exc, host_vars) from None
    chief_host = plan.chief.host
    job = resolved[chief_host]
    for host, values in resolved.items():
        for name in JOB_VARS:
            if values.get(name) != job.get(name):
                where = origin(host_vars[host].get(name)) or origin(host_vars[chief_host].get(name))
                raise ConfigError(
                    f"is {values.get(name)!r} on host {host!r} but {job.get(name)!r} on the chief's host "
                    f"{chief_host!r}{f' ({where})' if where else ''}; every task of a job needs the same job "
                    "settings, so set it for the whole job (group_vars/all, or the vars of a group of all its hosts)",
                    name,
                )
    _, launch = launch_from_vars(job, where=f"host {chief_host!r}")
    data = plan.to_json(launch)
    if job.get("tfps_config"):
        # The settings the job file gave, as the job has them (the inventory's where it set
        # them too): the role sets them as facts, for its tasks that read them.
        data["job_file"] = {name: job[name] for name in job_file_vars(str(job["tfps_config"])) if name in job}
    data["hosts"] = {host: {k: v for k, v in values.items() if k in LAYOUT_VARS} for host, values in resolved.items()}
    return data


def _with_origin(exc: ConfigError, host_vars: Mapping[str, Mapping[str, Any]]) -> ConfigError:
    """The same error, saying in which file and line the host's bad variable was set."""
    import re

    # The host the message asks to change comes first ("give host 'h1b' another ..."): its
    # line is the one to edit, not that of the host it collides with.
    named = re.findall(r"(?:give|set|change) host '([^']+)'", exc.message)
    for host in named + re.findall(r"host '([^']+)'", exc.message)[::-1]:
        where = origin(host_vars.get(host, {}).get(exc.field)) if exc.field else None
        if where:
            return ConfigError(f"{exc.message} (set in {where})", exc.field)
    return exc


def _missing_group(job: str, groups: Mapping[str, Sequence[str]]) -> ConfigError:
    import difflib

    others = [g for g in groups if g not in ("all", "ungrouped", PS, WORKER)]
    hint = difflib.get_close_matches(job, others, n=1, cutoff=0.5)
    kind = "parameter servers" if job == PS else "workers"
    what = f"the inventory has no hosts in group {job!r}" if job in groups else f"the inventory has no {job!r} group"
    fix = f"; it has a group {hint[0]!r}: rename it to {job!r}" if hint else ""
    return ConfigError(f"{what}; put the host(s) that run {kind} in a group named {job}{fix}", job)


def _ansible():
    try:
        import ansible.inventory.manager  # noqa: F401
    except ImportError:
        raise ConfigError(
            "reading an inventory needs ansible-core on this machine; install it with "
            "pip install 'tfps[ansible]' (or pip install ansible-core)",
            "inventory",
        ) from None


#: The file names Ansible's host_group_vars plugin reads for a group or host NAME.
_VARS_SUFFIXES = ("", ".yml", ".yaml", ".json")


def refuse_shadowed_vars(sources: Sequence[str], playbook_dir: str | None = None) -> None:
    """Refuse ``group_vars/NAME.yml`` beside a ``group_vars/NAME/`` directory (host_vars too):
    Ansible then reads only the directory and silently drops the file (a job planned with
    the defaults is the usual result, e.g. after adding group_vars/all/vault.yml)."""
    import os
    bases = [s if os.path.isdir(s) else os.path.dirname(os.path.abspath(s)) for s in sources if os.path.exists(s)]
    bases += [playbook_dir] if playbook_dir else []
    for base in dict.fromkeys(bases):
        for kind in ("group_vars", "host_vars"):
            folder = os.path.join(base, kind)
            if not os.path.isdir(folder):
                continue
            for name in sorted(os.listdir(folder)):
                if not os.path.isdir(os.path.join(folder, name)):
                    continue
                for suffix in _VARS_SUFFIXES:
                    if os.path.isfile(os.path.join(folder, name + suffix)):
                        raise ConfigError(f"{os.path.join(folder, name + suffix)} is ignored by Ansible because "
                                          f"{os.path.join(folder, name)}/ exists; move the file into the directory "
                                          f"(e.g. {kind}/{name}/vars.yml)", "inventory")


def load_view(
    sources: Sequence[str],
    extra_vars: Sequence[str] = (),
    vault_ids: Sequence[str] = (),
    vault_password_files: Sequence[str] = (),
    playbook_dir: str | None = None,
):
    """Ansible's view of the inventory, built as ``ansible-inventory --list`` builds it.

    The same steps as the CLI's, through ansible-core's public API (ansible-core 2.17 to
    2.21): ``ansible-inventory``'s own argument parser (so ``-e``, ``--vault-id`` and paths
    mean what they mean there), a DataLoader with the vault secrets, an InventoryManager and
    a VariableManager. Nothing is kept in ansible-core's per-process CLI state, so a second
    call in the same process brings its own sources, extra vars and vault passwords.

    Returns ``(groups, host_vars, defaults, template)`` for :func:`plan_from_view`.
    """
    _ansible()
    import os


    check_ansible()

    from ansible.cli.inventory import InventoryCLI
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.utils.vars import combine_vars
    from ansible.vars.manager import VariableManager

    for source in sources:
        if "," not in source and not os.path.exists(source):
            raise ConfigError("no such file or directory; pass an inventory file, directory, script or plugin "
                              "configuration, as for ansible-playbook -i", source)
    refuse_shadowed_vars(sources, playbook_dir)
    args = ["ansible-inventory", "--list"]
    for source in sources:
        args += [f"--inventory={source}"]
    for value in extra_vars:
        args += [f"--extra-vars={value}"]
    for value in vault_ids:
        args += [f"--vault-id={value}"]
    for value in vault_password_files:
        args += [f"--vault-password-file={value}"]
    if playbook_dir:
        args += [f"--playbook-dir={playbook_dir}"]
    warnings = _Warnings()
    try:
        options = _parse_args(InventoryCLI(args))
        _plugin_loader()
        loader = DataLoader()
        if options.basedir:
            _set_playbook_dir(loader, options.basedir)
        secrets = _vault_secrets(loader, options)
        with warnings, _VaultContext(secrets):
            inventory = InventoryManager(loader=loader, sources=options.inventory)
            manager = VariableManager(loader=loader, inventory=inventory,
                                      version_info=InventoryCLI.version_info(gitinfo=False))
        unparsed = warnings.unparsed(sources)
        if unparsed or not _parsed_sources(inventory):
            raise ConfigError(f"Ansible could not read it as an inventory: {warnings.reason()}; fix it and check "
                              "it with ansible-inventory -i SOURCE --list", unparsed or ",".join(sources))
        warnings.replay()
        with _VaultContext(secrets):
            extra = _extra_vars(loader, options.extra_vars)
            # What VariableManager takes from the CLI arguments of the process (and keeps from
            # the first call): the magic variables of ansible-inventory's options.
            magic = {"ansible_inventory_sources": options.inventory, "ansible_verbosity": options.verbosity}
            groups = inventory.get_groups_dict()
            host_vars = {}
            for host in dict.fromkeys(list(groups.get(PS) or []) + list(groups.get(WORKER) or [])):
                # -e outranks everything, as in VariableManager.get_vars (which would take it
                # from the process-wide CLI arguments instead).
                found = manager.get_vars(host=inventory.get_host(host), include_hostvars=False, stage="all")
                host_vars[host] = {**combine_vars(found, extra), **magic}
            defaults = _load_trusted(loader, str(DEFAULTS)) or {}
    except AnsibleError as exc:
        text = " ".join(str(exc).split())
        where = getattr(exc, "obj", None)
        where = origin(where) if where is not None else None
        if "vault" in text.lower() and ("secret" in text.lower() or "decrypt" in text.lower()):
            where = where or _vault_file(list(sources) + ([playbook_dir] if playbook_dir else []))
            raise ConfigError(f"a vault-encrypted file or value{f' ({where})' if where else ''} cannot be "
                              f"decrypted ({text}); pass --vault-password-file or --vault-id as for "
                              "ansible-playbook", "inventory") from None
        raise ConfigError(f"{text}; fix the inventory", where or "inventory") from None

    def template(value, variables):
        # Inline-vaulted values decrypt when they are used, with these secrets.
        with _VaultContext(secrets):
            return plain(Templar(loader=loader, variables=variables).template(value))

    return groups, host_vars, defaults, template


def _parse_args(cli):
    """The options of an ``ansible-inventory`` command line, parsed by that CLI's own parser
    (values tagged and paths made absolute as it does), without ``CLI.parse()``'s last step:
    storing them as the process's one global ``context.CLIARGS``."""
    cli.init_parser()
    return cli.post_process_args(cli.parser.parse_args(cli.args[1:]))


def _set_playbook_dir(loader, basedir: str) -> None:
    """``--playbook-dir``: what ``ansible-inventory`` does with it (group_vars/host_vars
    and plugins beside the playbook)."""
    from ansible.plugins.loader import add_all_plugin_dirs
    from ansible.utils.collection_loader import AnsibleCollectionConfig

    loader.set_basedir(basedir)
    add_all_plugin_dirs(basedir)
    AnsibleCollectionConfig.playbook_paths = basedir


def _vault_secrets(loader, options) -> list:
    """The vault secrets of ``--vault-id``/``--vault-password-file`` (and of ansible.cfg's
    vault settings), loaded into ``loader`` as ``ansible-inventory`` does."""
    import inspect

    from ansible.cli import CLI

    from ansible import constants as C

    kwargs = {}
    if "initialize_context" in inspect.signature(CLI.setup_vault_secrets).parameters:
        kwargs["initialize_context"] = False  # 2.19+: tfps sets the context per call (_VaultContext)
    secrets = CLI.setup_vault_secrets(loader, vault_ids=list(C.DEFAULT_VAULT_IDENTITY_LIST) + list(options.vault_ids),
                                      vault_password_files=list(options.vault_password_files),
                                      ask_vault_pass=options.ask_vault_pass, auto_prompt=False, **kwargs)
    loader.set_vault_secrets(secrets)
    return secrets


class _VaultContext:
    """These vault secrets for inline-vaulted values while the block runs.

    ansible-core 2.19+ decrypts an inline ``!vault`` value when it is used, with the
    secrets of the process-wide ``VaultSecretsContext``, which can be set only once per
    process. tfps sets it once (empty) and puts each call's secrets in it for the time
    it reads or templates variables, then puts back what was there. ansible-core 2.17 and
    2.18 keep the secrets in each value (from the loader): nothing to do there.
    """

    def __init__(self, secrets: list):
        self.secrets = secrets
        self.previous: list | None = None

    def __enter__(self):
        try:
            from ansible.parsing.vault import VaultSecretsContext
        except ImportError:  # ansible-core 2.17, 2.18
            self.context = None
            return self
        self.context = VaultSecretsContext.current(optional=True)
        if self.context is None:
            VaultSecretsContext.initialize(VaultSecretsContext([]))
            self.context = VaultSecretsContext.current()
        self.previous = self.context.secrets
        self.context.secrets = list(self.secrets)
        return self

    def __exit__(self, *exc):
        if self.context is not None:
            self.context.secrets = self.previous
        return False


def _extra_vars(loader, values: Sequence[str]) -> dict:
    """``-e`` values as one dict, read as ansible-core's ``load_extra_vars`` reads them
    (which takes them from the process's global CLI arguments and keeps the first result)."""
    from collections.abc import MutableMapping

    from ansible.errors import AnsibleOptionsError
    from ansible.parsing.splitter import parse_kv
    from ansible.utils.vars import combine_vars

    result: dict = {}
    for value in values or ():
        if not value:
            continue
        if value.startswith("@"):  # a YAML or JSON file
            data = _load_trusted(loader, value[1:])
        elif value[0] in ("/", "."):
            raise AnsibleOptionsError(f"Please prepend extra_vars filename '{value}' with '@'")
        elif value[0] in ("[", "{"):  # YAML or JSON
            data = loader.load(value)
        else:  # key=value ...
            data = parse_kv(value)
        if not isinstance(data, MutableMapping):
            raise AnsibleOptionsError(
                f"Invalid extra vars data supplied. '{value}' could not be made into a dictionary")
        result = combine_vars(result, data)
    return result


def _load_trusted(loader, path: str):
    """A YAML file of ours or of the user, its strings templated as the play would
    (2.19+ templates only strings marked trusted; 2.17 and 2.18 template every string)."""
    import inspect

    if "trusted_as_template" in inspect.signature(loader.load_from_file).parameters:
        return loader.load_from_file(path, trusted_as_template=True)
    return loader.load_from_file(path)


class _Warnings:
    """Ansible's warnings while it parses the inventory, held back to make one clear message."""

    def __init__(self):
        self.messages: list[str] = []

    def __enter__(self):
        from ansible.utils.display import Display

        self._display = Display()
        self._original = self._display.warning
        self._display.warning = lambda msg, *a, **k: self.messages.append(str(msg))
        # 2.19+ reports a source that failed to parse with error_as_warning (2.17, 2.18: warning).
        self._original_error = getattr(self._display, "error_as_warning", None)
        if self._original_error is not None:
            self._display.error_as_warning = lambda msg, exception=None, **k: self.messages.append(
                f"{msg} {exception}" if exception is not None else str(msg))
        return self

    def __exit__(self, *exc):
        self._display.warning = self._original
        if self._original_error is not None:
            self._display.error_as_warning = self._original_error
        return False

    def unparsed(self, sources: Sequence[str]) -> str | None:
        """The first source Ansible could not parse (it only warns and goes on without it)."""
        for message in self.messages:
            if message.startswith("Unable to parse ") and message.endswith(" as an inventory source"):
                return message[len("Unable to parse "):-len(" as an inventory source")]
        return None

    def reason(self) -> str:
        details = [m for m in self.messages if "Failed to parse" in m] or self.messages or ["no hosts were found"]
        return " ".join(details[0].split())

    def replay(self) -> None:
        for message in self.messages:
            self._original(message)


def _vault_file(places: Sequence[str]) -> str | None:
    """A vault-encrypted vars file beside these inventory sources (Ansible's error names none)."""
    from pathlib import Path

    for place in places:
        base = Path(place) if Path(place).is_dir() else Path(place).parent
        for kind in ("group_vars", "host_vars"):
            for path in sorted((base / kind).rglob("*")) if (base / kind).is_dir() else []:
                try:
                    with open(path, "rb") as fh:
                        if path.is_file() and fh.read(14) == b"$ANSIBLE_VAULT":
                            return str(path)
                except OSError:
                    continue
    return None


def _plugin_loader() -> None:
    """What ``ansible-inventory`` sets up before it reads: the collection finder (once per process)."""
    from ansible.utils.collection_loader import AnsibleCollectionConfig

    if not AnsibleCollectionConfig.collection_finder:
        from ansible.plugins.loader import init_plugin_loader

        init_plugin_loader([])


def _parsed_sources(inventory) -> bool:
    """Whether Ansible parsed at least one source (it only warns when none works)."""
    return bool(inventory.hosts or inventory.groups.get(PS))


def load_plan(sources: Sequence[str], **options) -> dict:
    """``tfps plan``: the plan's JSON for inventory sources, as the play would compute it."""
    return plan_from_view(*load_view(sources, **options))


def plan_of(data: Mapping) -> Plan:
    """The :class:`Plan` object back from the plan's JSON."""
    return Plan.from_tasks([Task(t["host"], t["address"], t["job"], t["index"], t["port"], t["gpu"])
                            for t in data["tasks"]])
