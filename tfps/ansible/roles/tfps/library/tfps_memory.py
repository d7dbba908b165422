#!/usr/bin/python
# The work is done by the action plugin of the same name (action_plugins/tfps_memory.py),
# on the controller; this file documents it.

DOCUMENTATION = r"""
---
module: tfps_memory
short_description: Each ps task's share of the variables, estimated on the controller
description:
  - Builds the job's training graph from the model's shapes as a worker builds it (no
    session, nothing allocated) and returns what each ps task will hold, in MB, the
    optimizer's slots included, and what the chief's export restores.
  - Runs on the controller and contacts no host. Needs tfps in the Python that runs
    ansible-playbook; without TensorFlow, the model or the training data there, the
    estimate is skipped (C(estimate) is null, C(msg) says why) and nothing fails.
options:
  plan:
    description: The plan (the fact C(tfps_plan)).
    type: dict
    required: true
  data_src:
    description: tfps_data_src, the training data on the controller.
    type: str
  train_data:
    description: tfps_train_data (with a directory data_src, the glob in it).
    type: str
  user_model_dir:
    description: tfps_user_model_dir, the model's module on the controller.
    type: str
author: tfps
"""

RETURN = r"""
estimate:
  description: shares_mb (ps task -> MB), export_mb, largest, largest_mb, optimizer, slots_mb; null when skipped.
  returned: always
  type: dict
msg:
  description: The shares in one line, or why the estimate was skipped.
  returned: always
  type: str
"""


def main():
    raise SystemExit("tfps_memory runs on the controller as an action plugin")


if __name__ == "__main__":
    main()
