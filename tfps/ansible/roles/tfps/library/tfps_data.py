#!/usr/bin/python
# The work is done by the action plugin of the same name (action_plugins/tfps_data.py),
# on the controller; this file documents it.

DOCUMENTATION = r"""
---
module: tfps_data
short_description: Which training files of tfps_data_src each worker host gets
description:
  - Expands tfps_data_src (a directory or glob on the controller) and assigns its training
    files to the worker hosts with tfps's own sharding rule, so that each host gets
    only the files its workers read (and the chief's host the evaluation files).
  - Runs on the controller and contacts no host. Needs tfps installed in the Python that
    runs ansible-playbook.
options:
  src:
    description: Directory or glob of the data on the controller.
    type: str
    required: true
  train_data:
    description: Glob of the training files under /input (with a directory src).
    type: str
  eval_data:
    description: Glob of the evaluation files under /input (read by the chief).
    type: str
  job:
    description: The job's name; its list of training files is .tfps-<job>-train-files.
    type: str
    default: train
  worker_hosts:
    description: The host of each worker, by worker index.
    type: list
    elements: str
    required: true
  checksums:
    description: Also read the sha256 and size of every file, and the list file's text.
    type: bool
    default: false
author: tfps
"""

RETURN = r"""
data:
  description: base, list, train (the list of container paths), hosts (host -> relative paths), and with
    checksums files (relative path -> sha256, size) and list_text.
  returned: success
  type: dict
"""


def main():
    raise SystemExit("tfps_data runs on the controller as an action plugin")


if __name__ == "__main__":
    main()
