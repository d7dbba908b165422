"""What a system test reads of a job run with ``--export_every`` and ``--keep_exports``
(tfps.task.output.versions): the versions in the export base path, each complete, at least one
besides the last exported while the job trained, the newest K kept, and results.json naming the last.

The compose test (test_compose_ctr.py) and the Ansible test of the shared finished job
(test_ansible.py) give it the files of the base path and the chief's log.
"""

from __future__ import annotations

import json
import re
from datetime import datetime

#: The chief's line for each version it wrote (tfps.task.output.versions.Versions.export).
EXPORTED = re.compile(r"chief: exported version (\d+) \(global step (\d+)\)")


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def check_versions(files: dict[str, bytes | None], chief_log: str, results: dict, keep: int) -> list[dict]:
    """``files``: the base path's files, relative name -> bytes (None for a directory).

    Every version the chief's log says it wrote has an increasing number; the base path holds
    exactly the newest ``keep`` of them (older ones removed), no half-written ``.tmp-*``,
    and each one there is a complete SavedModel whose ``tfps_export.json`` names it; at
    least one besides the last was exported while the job trained (two or more are the rule;
    one is allowed: a loaded machine may export slower than the job trains) (a global step below the
    last one's, an export time before results.json was written); results.json's
    ``export_dir`` names the last. Returns the metadata of the versions kept, lowest first."""
    written = [(int(v), int(s)) for v, s in EXPORTED.findall(chief_log)]
    numbers = [v for v, _ in written]
    assert numbers and numbers == sorted(set(numbers)), f"versions not increasing in the chief's log: {written}"
    on_disk = sorted({int(name.split("/")[0]) for name in files if name.split("/")[0].isdigit()})
    assert on_disk == numbers[-keep:], (on_disk, written)
    assert not [n for n in files if n.startswith(".tmp-")], sorted(files)
    kept = []
    for v in on_disk:
        for part in ("saved_model.pb", "variables/variables.index", "tfps_export.json"):
            assert files.get(f"{v}/{part}"), f"version {v} has no {part}: {sorted(n for n in files if n.startswith(f'{v}/'))}"
        assert any(n.startswith(f"{v}/variables/variables.data-") for n in files), f"version {v}: no variables data"
        meta = json.loads(files[f"{v}/tfps_export.json"])
        assert meta["version"] == v, meta
        kept.append(meta)
    assert results["export_dir"].rstrip("/").rsplit("/", 1)[-1] == str(on_disk[-1]), (results["export_dir"], on_disk)
    last = kept[-1]
    during = [m for m in kept[:-1] if m["global_step"] < last["global_step"] <= results["global_step"]
              and _when(m["exported_at"]) <= _when(results["ended_at"])]
    assert during, f"no version exported while the job trained: {kept}, {written}"
    print(f"versions (version, global step) written: {written}; kept: {on_disk}; "
          f"exported while training: {[m['version'] for m in during]}")
    return kept
