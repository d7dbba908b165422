"""What the compose and Ansible fault-injection matrices share: the job, the table, the checks.

Each matrix SIGKILLs the ps, the chief or a non-chief worker at a random step between the
first and the last checkpoint, in async and sync mode, and prints one table row per case:
fault, mode, recovered, seconds to recover, the step at the kill, the checkpoint training
resumed from, and the steps redone (at most one checkpoint interval).
"""

from __future__ import annotations

import json
import random
import re

STEPS = 1000
CHECKPOINT = 200          # the trainer's default: train_steps / 5
RESTORED = re.compile(r"Restoring parameters from \S*model\.ckpt-(\d+)")
HEADER = (f"{'fault':<20} {'mode':<6} {'recovered':<10} {'recover s':>9} {'killed at':>9} {'resumed from':>12} "
          f"{'redone':>6}")


def kill_target() -> int:
    """A random step between the first and the last periodic checkpoint."""
    return random.randint(CHECKPOINT + 20, STEPS - CHECKPOINT - 20)


def print_table(title: str, rows: list[str]) -> None:
    if rows:
        print(f"\n{title}\n{HEADER}")
        for row in rows:
            print(row)


def resumed_from(chief_log: str, victim_is_worker: bool, kill_step: int, what: str) -> int:
    """The checkpoint the chief restored in ``chief_log`` (its log since the kill), or the
    step at the kill when a non-chief worker was lost (nothing may be rolled back then).
    Restores after the last progress line (the export, the evaluation) do not count."""
    progress_end = chief_log.rfind(": step ")
    restored = [int(m.group(1)) for m in RESTORED.finditer(chief_log, 0, max(progress_end, 0))]
    if victim_is_worker:
        assert not restored, f"losing a non-chief worker rolled the model back to {restored}"
        return kill_step
    assert restored, f"the chief restored no checkpoint after {what} was killed:\n{chief_log[-3000:]}"
    return restored[0]


def add_row(rows: list[str], victim: str, mode: str, recover_s, kill_step: int, resumed: int) -> None:
    """Record the case, then require at most one checkpoint interval of redone steps."""
    redone = max(kill_step - resumed, 0)
    rows.append(f"{victim:<20} {mode:<6} {'yes':<10} {recover_s if recover_s is not None else '-':>9} "
                f"{kill_step:>9} {resumed:>12} {redone:>6}")
    assert redone <= CHECKPOINT, f"{redone} steps redone, more than one checkpoint interval"


def predict_script(export_dir: str) -> str:
    """Python for a fresh trainer container: load the SavedModel, predict a batch of 4,
    print the batch size of every output as JSON."""
    return ("import json, numpy as np, tensorflow as tf; "
            f"m = tf.saved_model.load('{export_dir}'); f = m.signatures['serving_default']; "
            "shape = [d if d else 4 for d in f.structured_input_signature[1]['features'].shape.as_list()]; "
            "out = f(features=tf.constant(np.random.default_rng(0).normal(size=shape), tf.float32)); "
            "print(json.dumps({k: v.numpy().shape[0] for k, v in out.items()}))")


def assert_predicts(output: str) -> None:
    predictions = json.loads(output.strip().splitlines()[-1])
    assert predictions and all(n == 4 for n in predictions.values()), predictions
