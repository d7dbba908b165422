"""Whole jobs on one machine: ``tfps local`` (processes) and ``tfps compose`` (a compose file).

Both take the cluster from :mod:`trainer.cluster` (the plan) and every task's options
from :meth:`trainer.config.RunConfig.to_args`; the Ansible role is the third launcher.
"""
