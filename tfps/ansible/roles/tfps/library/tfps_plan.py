#!/usr/bin/python
# The work is done by the action plugin of the same name (action_plugins/tfps_plan.py),
# on the controller; this file documents it.

DOCUMENTATION = r"""
---
module: tfps_plan
short_description: The tfps cluster plan from the play's resolved inventory
description:
  - Computes the cluster plan (task numbering, ports, GPUs, container names, argv, stop
    timeouts, environment) from the play's C(groups) and C(hostvars), with the same
    Python code as C(tfps plan -i), and sets it as the fact C(tfps_plan) of every host.
  - Runs on the controller and contacts no host. Needs tfps installed in the Python
    that runs ansible-playbook (C(pip install 'tfps[ansible]')).
options:
  base_ports:
    description:
      - Inventory host -> first TF port that tfps_ports chose there; applies to hosts whose
        inventory sets no tfps_base_port.
    type: dict
author: tfps
"""

RETURN = r"""
ansible_facts:
  description: The plan, as C(tfps plan --format json) prints it.
  returned: success
  type: dict
"""


def main():
    raise SystemExit("tfps_plan runs on the controller as an action plugin")


if __name__ == "__main__":
    main()
