"""Action tfps_data: which training files of tfps_data_src each worker host gets.

Runs on the controller and contacts no host. ``tfps.cluster.datasrc.assign`` decides,
with tfps's own sharding function (``tfps.data.dataset.shard_files``), so the files a
host receives are the files its workers read. With ``checksums``, the result also holds
the sha256 and size of every file (read on the controller) and the text of the job's list
of training files the workers shard.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        from tfps.cluster import datasrc
        from tfps.errors import ConfigError

        try:
            data = datasrc.assign(str(args["src"]), args.get("train_data") or None, args.get("eval_data") or None,
                                  [str(h) for h in args["worker_hosts"]], str(args.get("job") or "train"))
            if boolean(args.get("checksums", False), strict=False):
                data = datasrc.with_checksums(data)
                data["list_text"] = datasrc.list_text(data)
        except ConfigError as exc:
            raise AnsibleActionFail(str(exc)) from None
        except OSError as exc:
            raise AnsibleActionFail(f"tfps_data_src: cannot read {exc.filename} on the controller ({exc.strerror})") \
                from None
        result.update(changed=False, data=data,
                      msg=f"{len(data['train'])} training file(s) for {len(data['hosts'])} worker host(s)")
        return result
