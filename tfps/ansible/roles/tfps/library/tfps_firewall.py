#!/usr/bin/python
# Runs on each host of the job: all of the job's iptables rules of the host in one module
# run (accept the host itself and the cluster's addresses on each TF port, drop the rest),
# and their save for the next boot. It replaced three loops of ansible.builtin.iptables
# (one module run per rule: 6 runs per host of a job of three hosts) and a command.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tfps_firewall
short_description: Keep a tfps job's iptables rules on a host, and save them for the next boot
description:
  - For each rule of I(rules), in order, asks iptables whether it is in the C(INPUT) chain
    (C(iptables -C)), and with I(state=present) inserts it at the top or appends it
    (I(action)) when it is not; with I(state=absent) deletes every copy of it.
  - With I(save), compares the rules whose comment starts with I(marker) in the live
    filter table (C(iptables-save)) and in C(/etc/iptables/rules.v4), and runs
    C(netfilter-persistent save) when they differ, so that the rules come back after a reboot.
  - Check mode reports what would change and changes nothing (and saves nothing).
options:
  rules:
    description: The rules, each a TCP destination port with a comment and a target.
    type: list
    elements: dict
    required: true
    suboptions:
      port:
        description: The TCP destination port.
        type: int
        required: true
      comment:
        description: The rule's comment (C(tfps <job> <task>)).
        type: str
        required: true
      jump:
        description: The target.
        type: str
        choices: [ACCEPT, DROP]
        required: true
      source:
        description: Only connections from this address.
        type: str
      in_interface:
        description: Only connections that arrive on this interface (C(lo) for the host itself).
        type: str
      action:
        description: Where a missing rule goes.
        type: str
        choices: [insert, append]
        default: insert
  state:
    description: Whether the rules should be there.
    type: str
    choices: [present, absent]
    default: present
  save:
    description: Save the live rules with netfilter-persistent when this job's differ from the saved ones.
    type: bool
    default: false
  marker:
    description: How this job's rules start in iptables-save's output (C(--comment "tfps <job> )); needed with I(save).
    type: str
    default: ""
author: tfps
"""

RETURN = r"""
added:
  description: The rules inserted or appended (C(iptables -S) form, without the chain).
  type: list
  returned: always
removed:
  description: The rules deleted.
  type: list
  returned: always
saved:
  description: Whether netfilter-persistent saved the rules.
  type: bool
  returned: always
"""

import shlex  # noqa: E402

RULES_V4 = "/etc/iptables/rules.v4"


def rule_args(rule: dict) -> list[str]:
    """The rule's match and target, as iptables takes them after the chain."""
    args = ["-p", "tcp"]
    if rule.get("source"):
        args += ["-s", str(rule["source"])]
    if rule.get("in_interface"):
        args += ["-i", str(rule["in_interface"])]
    return args + ["--dport", str(rule["port"]), "-m", "comment", "--comment", str(rule["comment"]),
                   "-j", str(rule["jump"])]


def job_lines(text: str, marker: str) -> list[str]:
    return [line for line in text.splitlines() if marker in line]


def main():
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec=dict(
            rules=dict(type="list", elements="dict", required=True, options=dict(
                port=dict(type="int", required=True),
                comment=dict(type="str", required=True),
                jump=dict(type="str", required=True, choices=["ACCEPT", "DROP"]),
                source=dict(type="str"),
                in_interface=dict(type="str"),
                action=dict(type="str", default="insert", choices=["insert", "append"]),
            )),
            state=dict(type="str", default="present", choices=["present", "absent"]),
            save=dict(type="bool", default=False),
            marker=dict(type="str", default=""),
        ),
        required_if=[("save", True, ("marker",))],
        supports_check_mode=True,
    )
    p = module.params
    iptables = module.get_bin_path("iptables", required=True)

    def run(*args: str, check_rc: bool = True) -> int:
        rc, out, err = module.run_command([iptables, "-w", *args])
        if check_rc and rc != 0:
            module.fail_json(msg=f"iptables {shlex.join(args)} failed ({rc}): {(err or out).strip()}")
        return rc

    def present(args: list[str]) -> bool:
        return run("-C", "INPUT", *args, check_rc=False) == 0

    added, removed = [], []
    for rule in p["rules"]:
        args = rule_args(rule)
        shown = shlex.join(args)
        if p["state"] == "present":
            if not present(args):
                added.append(shown)
                if not module.check_mode:
                    run("-I" if rule["action"] == "insert" else "-A", "INPUT", *args)
        elif present(args):
            removed.append(shown)
            if not module.check_mode:
                while present(args):
                    run("-D", "INPUT", *args)

    saved = False
    if p["save"] and not module.check_mode:
        save_bin = module.get_bin_path("iptables-save", required=True)
        _, live, _ = module.run_command([save_bin, "-t", "filter"], check_rc=True)
        try:
            with open(RULES_V4) as fh:
                kept = fh.read()
        except OSError:
            kept = ""
        if job_lines(live, p["marker"]) != job_lines(kept, p["marker"]):
            persistent = module.get_bin_path("netfilter-persistent", required=True)
            rc, out, err = module.run_command([persistent, "save"])
            if rc != 0:
                module.fail_json(msg=f"netfilter-persistent save failed ({rc}): {(err or out).strip()}",
                                 added=added, removed=removed)
            saved = True
    module.exit_json(changed=bool(added or removed or saved), added=added, removed=removed, saved=saved)


if __name__ == "__main__":
    main()
