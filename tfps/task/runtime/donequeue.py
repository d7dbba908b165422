"""The job's end, shared by name on the ps: the "done" queue of each ps and the chief's stop flag.

The ps never blocks in ``server.join()``: it waits for one token per worker on a queue it
hosts (``done_queue``) and exits 0 by itself. Workers enqueue their index when they are
finished; the chief does so only after its final checkpoint and export are on disk, so the
ps always outlives the final save.
"""

from __future__ import annotations

#: Room for many duplicate tokens (a restarted worker reports again): enqueues never block.
DONE_QUEUE_CAPACITY = 1024


def done_queue(ps_index: int, num_workers: int):
    """The queue of "worker i is done" tokens hosted by ps ``ps_index`` (same op everywhere)."""
    import tensorflow as tf
    with tf.device(f"/job:ps/task:{ps_index}"):
        return tf.compat.v1.FIFOQueue(DONE_QUEUE_CAPACITY, [tf.int32], shapes=[[]],
                                      shared_name=f"tfps_done_ps{ps_index}", name=f"tfps_done_ps{ps_index}")


def stop_flag():
    """The chief's "stop now" to every worker: a variable on ps 0, shared by name.

    A local variable, so it is never checkpointed: a job resumed from a stopped one does
    not stop again at once.
    """
    import tensorflow as tf
    v1 = tf.compat.v1
    with v1.device("/job:ps/task:0"):
        return v1.get_variable("tfps_stop_requested", initializer=False, trainable=False,
                               collections=[v1.GraphKeys.LOCAL_VARIABLES])
