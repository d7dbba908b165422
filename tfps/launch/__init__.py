"""Whole jobs on one machine: ``tfps local`` (processes) and ``tfps compose`` (a compose file).

Both take the cluster from :mod:`tfps.cluster` (the plan) and every task's options
from :meth:`tfps.config.RunConfig.to_args`; the Ansible role is the third launcher.
"""
