"""ansible-core's internals that tfps reads (tfps.cluster.inventory, the role's tfps_plan action)."""

from __future__ import annotations

from tfps.compat import _stores
from tfps.errors import ConfigError

# ansible-core 2.17 to 2.21 (``ansible-core>=2.17,<2.22`` in pyproject.toml). tfps reads
# inventories through ansible-core's public API (tfps.cluster.inventory); what the public
# API leaves out is here: where a value was read (2.19+ data tags), and, for the role's
# tfps_plan action, the play's VariableManager and the task's role.

ANSIBLE_CORE_OLDEST = "2.17"
_ANSIBLE_CHECKED = False


def _ansible_missing() -> list[tuple[str, str]]:
    from ansible.playbook.task import Task
    from ansible.vars.hostvars import HostVars

    missing = []
    if _ansible_has_data_tags():
        try:
            from ansible._internal._datatag import _tags
        except ImportError:
            _tags = None
        if not callable(getattr(getattr(_tags, "Origin", None), "get_tag", None)):
            missing.append(("Origin.get_tag", "ansible._internal._datatag._tags (2.19+)"))
    for attr in ("_inventory", "_variable_manager"):
        if not _stores(HostVars.__init__, attr):
            missing.append((f"HostVars.{attr}", "ansible.vars.hostvars"))
    if not _stores(Task.__init__, "_role"):
        missing.append(("Task._role", "ansible.playbook.task"))
    from ansible.utils.collection_loader import AnsibleCollectionConfig  # the patch ansible-playbook-paths
    if not isinstance(getattr(type(AnsibleCollectionConfig), "playbook_paths", None), property):
        missing.append(("AnsibleCollectionConfig.playbook_paths", "ansible.utils.collection_loader"))
    return missing


def _ansible_has_data_tags() -> bool:
    """ansible-core 2.19+ tags every value it reads with its origin (2.17, 2.18 do not)."""
    from ansible.release import __version__

    return tuple(int(p) for p in __version__.split(".")[:2]) >= (2, 19)


def check_ansible() -> None:
    """Refuse (ConfigError, one line) an ansible-core that lacks an internal tfps uses:
    ``tfps needs X from ansible-core 2.17+'s Y; this is ansible-core Z``.

    Run before ``tfps plan`` reads an inventory and by the role's tfps_plan action.
    """
    global _ANSIBLE_CHECKED
    if _ANSIBLE_CHECKED:
        return
    from ansible.release import __version__

    missing = _ansible_missing()
    if missing:
        what, where = missing[0]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ConfigError(f"tfps needs {what} from ansible-core {ANSIBLE_CORE_OLDEST}+'s {where}; this is "
                          f"ansible-core {__version__}{more}. Install a supported one: pip install 'tfps[ansible]' "
                          "(ansible-core>=2.17,<2.22)")
    _ANSIBLE_CHECKED = True


def ansible_origin(value) -> str | None:
    """Where ansible-core read a value or a variable name (``file:line[:column]``), or None.

    2.19+: the value's Origin tag (INI, YAML, -e). 2.17, 2.18: the position a YAML value
    carries (``ansible_pos``, public); INI values and -e carry none there.
    """
    if _ansible_has_data_tags():
        from ansible._internal._datatag._tags import Origin

        tag = Origin.get_tag(value)
        return str(tag) if tag is not None else None
    source, line, column = getattr(value, "ansible_pos", None) or (None, 0, 0)
    if not source:
        return None
    return f"{source}:{line}:{column}" if line and column else f"{source}:{line}" if line else str(source)


def ansible_play_variables(hostvars):
    """The play's ``(VariableManager, InventoryManager)`` behind ``task_vars['hostvars']``,
    or ``(None, None)``: the action resolves each host's variables with the play and task."""
    return getattr(hostvars, "_variable_manager", None), getattr(hostvars, "_inventory", None)


def ansible_play_facts(manager, host: str) -> set:
    """Names the play set on ``host`` itself (registered results, set_fact, gathered facts):
    results of its tasks, never inventory settings."""
    names: set = set()
    for cache in ("_nonpersistent_fact_cache", "_fact_cache"):
        try:
            names |= set(getattr(manager, cache, {}).get(host, {}) or {})
        except Exception:  # noqa: BLE001 - a cache plugin that cannot be read: nothing to leave out
            pass
    return names


def ansible_task_role(task):
    """The role a task belongs to (its defaults and vars), or None."""
    return getattr(task, "_role", None)
