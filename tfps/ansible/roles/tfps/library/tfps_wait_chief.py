#!/usr/bin/python
# The work is done by the action plugin of the same name (action_plugins/tfps_wait_chief.py);
# this file documents it.

DOCUMENTATION = r"""
---
module: tfps_wait_chief
short_description: Wait for a tfps job's chief container to exit, printing its progress
description:
  - Looks at the chief's container every I(poll) seconds (one short module run per look) until
    it has exited or I(timeout) seconds have passed, and prints one line per look that shows a
    change - step/total, loss, examples/s and ETA from the job's history.jsonl.
  - Returns the last docker_container_info result (exists, container).
options:
  container:
    description: Name of the chief's container.
    type: str
    required: true
  history:
    description: Path of the job's history.jsonl on the chief's host (empty for a classic script, which keeps none).
    type: str
    required: true
  train_steps:
    description: The job's total steps.
    type: int
    required: true
  job:
    description: The job's name, shown in each line.
    type: str
  poll:
    description: Seconds between looks.
    type: float
    default: 15
  timeout:
    description: Seconds to wait at most.
    type: float
    default: 86400
author: tfps
"""
