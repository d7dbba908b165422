"""Action tfps_plan: the cluster plan from what this play resolved.

Runs on the controller and contacts no host. It hands the play's own ``groups`` and
every job host's variables (``hostvars``, so -e, group_vars beside the inventory or
the playbook, Vault and every precedence rule count) to tfps's planning code,
``tfps.cluster.inventory.plan_from_view``: the same function ``tfps plan -i``
calls, so the two cannot disagree, and there is no Jinja copy of the task numbering.
The plan becomes the fact ``tfps_plan`` of every host of the play.

``base_ports`` (inventory host -> port) gives the hosts without ``tfps_base_port`` the
first port that ``tfps_ports`` chose for the job there; the plan is then computed again.

Each host's variables are resolved as this task sees them on that host: inventory, -e,
and also the play's ``vars:``/``vars_files:`` and the role's vars and parameters, which
``hostvars`` alone leaves out (ansible-core resolves ``hostvars[h]`` without a play).
"""

from __future__ import annotations

import sys

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def _host_vars(self, hostvars, host: str, derived: dict, defaults: dict) -> dict:
        """``host``'s variables in this play and task, untemplated (as ``hostvars.raw_get``),
        without ``derived`` (the role's vars/main.yml: values derived from the plan, not settings)
        and without the role's ``defaults`` that nothing else set (a tfps_config job file's
        settings replace those)."""
        from tfps.compat import ansible_play_facts, ansible_play_variables

        manager, inventory = ansible_play_variables(hostvars)
        play = self._task.get_play() if hasattr(self._task, "get_play") else None
        if manager is None or inventory is None or play is None or inventory.get_host(host) is None:
            return hostvars.raw_get(host)
        found = manager.get_vars(play=play, host=inventory.get_host(host), task=self._task, include_hostvars=False)
        # What the play's own tasks set (tfps_plan, tfps_ports, ...) is not a setting; a
        # setting set with set_fact still counts.
        from tfps.cluster.variables import catalogue

        facts = ansible_play_facts(manager, host) - set(catalogue())
        own = hostvars.raw_get(host)   # inventory, -e and facts: no play, no role defaults
        return {k: v for k, v in found.items() if k not in derived and k not in facts
                and (k in own or k not in defaults or v != defaults[k])}

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        try:
            from tfps.cluster.inventory import plan_from_view
            from tfps.compat import ansible_task_role, check_ansible
            from tfps.errors import ConfigError
        except ImportError as exc:
            raise AnsibleActionFail(
                f"the tfps role needs tfps on the controller, in the Python that runs ansible-playbook "
                f"({sys.executable}): install it there with pip install 'tfps[ansible]' ({exc})"
            ) from None
        groups = task_vars["groups"]
        hostvars = task_vars["hostvars"]
        hosts = list(dict.fromkeys(list(groups.get("ps", [])) + list(groups.get("worker", []))))
        try:
            check_ansible()
        except ConfigError as exc:
            raise AnsibleActionFail(f"tfps plan: {exc}") from None
        role = ansible_task_role(self._task)
        defaults = role.get_default_vars() if role is not None else {}
        derived = role.get_vars(include_params=False) if role is not None else {}
        raw = {host: self._host_vars(hostvars, host, derived, defaults) for host in hosts}
        # The ports tfps_ports chose on each host where the inventory sets no tfps_base_port.
        for host, port in (self._task.args.get("base_ports") or {}).items():
            if host in raw and port not in (None, "") and "tfps_base_port" not in raw[host]:
                raw[host] = {**raw[host], "tfps_base_port": int(port)}

        def template(value, variables):
            return self._templar.copy_with_new_env(available_variables=variables).template(value)

        try:
            plan = plan_from_view(groups, raw, defaults, template)
        except ConfigError as exc:
            raise AnsibleActionFail(f"tfps plan: {exc}") from None
        result.update(changed=False, plan=plan,
                      msg=f"{len(plan['cluster']['ps'])} ps, {len(plan['cluster']['worker'])} worker(s)")
        return result
