"""Every run-time patch tfps applies to another library, by name, and the start-up check that
each still fits its target (``tfps.compat.check_tensorflow`` runs it in every task)."""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from pathlib import Path

from tfps.compat import (
    _CHECKPOINT_MANAGEMENT,
    TENSORFLOW_VERSION,
    TF_CC_LIBRARY,
    TF_EAGER_KERAS_MODULES,
    TF_KERAS_VERSION,
)
from tfps.errors import ConfigError, real_os_exit


# =================================================================== run-time patches
#: Every place where tfps changes another library's code or state at run time, by name.
#: ``tests/unit/test_patches.py`` fails on a patch whose module is not a ``site`` here, and
#: ``check_patches`` (in every task's start, from ``check_tensorflow``) checks each one still
#: fits its target. ``checked_on``: the releases it was read and tested against.
@dataclasses.dataclass(frozen=True)
class Patch:
    name: str
    site: str          # the tfps module that applies it
    what: str
    checked_on: str


_TF = f"TensorFlow {TENSORFLOW_VERSION}"
PATCHES = (
    Patch("bind-got", "tfps/task/net/loopback.py", f"{TF_CC_LIBRARY}'s GOT entry for bind: a wildcard bind "
          "becomes the task's own address (docs/design/loopback.md)", _TF),
    Patch("checkpoint-file-io", "tfps/compat/__init__.py", "checkpoint_management's file_io: checkpoint globs "
          "quote their directory (a model_dir named exp[lr=0.01])", _TF),
    Patch("critical-section-collections", "tfps/compat/patches.py", "TensorFlow's critical_sections graph "
          "collections are emptied after each DynamicEmbedding lock (a meta graph cannot hold them)", _TF),
    Patch("keras-add-weight", "tfps/compat/__init__.py", "tf_keras Layer.add_weight is wrapped while a model is "
          "built (placement of its weights; in_keras_add_weight marks a Keras weight's creation)",
          f"tf_keras {TF_KERAS_VERSION}"),
    Patch("keras-optimizer-serialize", "tfps/compat/__init__.py", "a tf_keras optimizer's _serialize_hyperparameter, "
          "for one get_config()", f"tf_keras {TF_KERAS_VERSION}"),
    Patch("eager-keras-import", "tfps/task/__init__.py", "sys.modules entries of Keras's optimizers are None "
          "during import tensorflow, and removed after", _TF),
    Patch("ansible-playbook-paths", "tfps/cluster/inventory.py", "AnsibleCollectionConfig.playbook_paths is "
          "set for --playbook-dir, as ansible-inventory does (checked by check_ansible)", "ansible-core 2.17-2.19"),
    Patch("user-code-exit", "tfps/errors.py", "os._exit is replaced while a model's code runs, and put back",
          "CPython 3.11"),
)


def clear_critical_section_collections(graph) -> None:
    """Empty the two collections tf.CriticalSection keeps for its build-time checks."""
    for key in _CRITICAL_SECTION_KEYS:
        graph.clear_collection(key)


_CRITICAL_SECTION_OPS = "tensorflow.python.ops.critical_section_ops"
_CRITICAL_SECTION_KEYS = ("critical_sections", "critical_section_executions")


def _patch_misfits() -> list[tuple[str, str]]:
    """(patch, why it no longer fits) for each registered patch whose target changed."""
    misfits = []
    maps = Path("/proc/self/maps").read_text(errors="replace") if os.path.exists("/proc/self/maps") else ""
    if maps and TF_CC_LIBRARY not in maps:
        misfits.append(("bind-got", f"{TF_CC_LIBRARY} is not loaded by import tensorflow"))
    checkpoints = importlib.import_module(_CHECKPOINT_MANAGEMENT)
    if not callable(getattr(getattr(checkpoints, "file_io", None), "get_matching_files", None)):
        misfits.append(("checkpoint-file-io", f"{_CHECKPOINT_MANAGEMENT} has no file_io.get_matching_files"))
    ops = importlib.import_module(_CRITICAL_SECTION_OPS)
    if (getattr(ops, "CRITICAL_SECTIONS", None), getattr(ops, "CRITICAL_SECTION_EXECUTIONS", None)) \
            != _CRITICAL_SECTION_KEYS:
        misfits.append(("critical-section-collections", f"{_CRITICAL_SECTION_OPS} names other collections"))
    if any(sys.modules.get(name, True) is None for name in TF_EAGER_KERAS_MODULES):
        misfits.append(("eager-keras-import", "an import block was left in sys.modules"))
    if os._exit is not real_os_exit:
        misfits.append(("user-code-exit", "os._exit is still replaced outside a model's code"))
    return misfits


def check_patches() -> None:
    """Refuse (ConfigError, one line) when a registered patch no longer fits its target."""
    misfits = _patch_misfits()
    if misfits:
        name, why = misfits[0]
        patch = next(p for p in PATCHES if p.name == name)
        more = f" (and {len(misfits) - 1} more)" if len(misfits) > 1 else ""
        raise ConfigError(f"tfps's run-time patch {name} ({patch.site}) no longer fits: {why}{more}; it was "
                          f"checked on {patch.checked_on}. Install {patch.checked_on}")
