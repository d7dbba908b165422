"""The chief's session creator: join the live variables when every ps kept them.

A restarted chief used to restore its newest checkpoint over the variables the ps still
held, discarding what the other workers trained meanwhile (async) and the steps since
that checkpoint. Now, whenever its session is created (at its start, and when
MonitoredSession recreates it after losing a ps), the chief first asks the ps whether
every global variable is initialised (except for the very first session of a job's first
attempt, when nobody can have initialised them):

* yes: it joins the live state the way a non-chief worker does (no initialisation, no
  restore) and logs ``joined the live variables at step N``; nothing is redone;
* no (a new job, or a ps that lost its variables): it restores the newest checkpoint, or
  initialises, and logs ``restored checkpoint of step N from PATH``;
* no answer (a ps frozen, starting again, or slow under load): it asks again until one
  comes, for at most ``answer_within`` seconds (``--sync_timeout``). Taking the checkpoint
  path at the first unanswered probe (10 s) would restore the checkpoint over variables a
  frozen or slow ps still holds: the job rolled back although nothing was lost. Only when
  no answer comes in that time does it restore, with a line that names the setting.

In sync mode the token queue on the ps may still hold tokens of the previous chief; they
are drained before the sync hook (tfps.task.graph.syncagg) puts in one step's tokens, so that
every step again takes exactly one gradient per token.

``on_session(how, step, lost)`` tells the chief what happened: ``how`` is "joined",
"restored" or "initialised", ``lost`` the ps tasks whose variables were gone.
"""

from __future__ import annotations

import itertools
import logging
import re
import time

import tensorflow as tf

from tfps import compat, timeouts
from tfps.cluster.spec import PS, task_name
from tfps.task.output import delta
from tfps.task.output.checkpoint import checkpoint_step
from tfps.task.runtime.hooks import RestoreLoggingChiefSessionCreator

v1 = tf.compat.v1
log = logging.getLogger("tfps")

#: Tokens the drain takes out at most (the queue holds at most a few steps' worth).
DRAIN_LIMIT = 1024


def _ps_of(var_name: str, graph) -> str | None:
    try:
        device = graph.get_operation_by_name(var_name).device
    except (KeyError, ValueError):
        return None
    m = re.search(r"/job:ps/(?:replica:\d+/)?task:(\d+)", device or "")
    return task_name(PS, int(m.group(1))) if m else None


class LiveJoiningChiefSessionCreator(RestoreLoggingChiefSessionCreator):
    """See the module docstring."""

    def __init__(self, *args, global_step=None, token_queue=None, on_session=None, first_attempt=False,
                 answer_within: float = 300.0, **kw):
        super().__init__(*args, **kw)
        self._answer_within = answer_within
        self._global_step, self._token_queue, self._on_session = global_step, token_queue, on_session
        # The first session of a job's first chief attempt: nobody can have initialised the
        # ps's variables before it, so it need not ask (one session and one run fewer at start).
        self._skip_probe = first_attempt
        if token_queue is not None:   # built here, in the training graph before it is finalized
            self._size, self._drain = token_queue.size(), token_queue.dequeue()

    def _uninitialised(self) -> list[str] | None:
        """Names of the global variables the ps do not hold; None when they do not answer."""
        # The scaffold's own check of the global variables (and shared resources), which a
        # non-chief's session runs too: no second copy of it in the graph.
        probe = compat.session_creator_scaffold(self).ready_for_local_init_op
        try:
            with v1.Session(compat.session_creator_master(self), config=compat.session_creator_config(self)) as s:
                names = s.run(probe, options=v1.RunOptions(timeout_in_ms=timeouts.REJOIN_PROBE_TIMEOUT_MS))
            return [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        except tf.errors.OpError as e:
            log.debug("probing the ps's variables failed: %s", e.message.splitlines()[0])
            return None

    def _probe(self) -> list[str] | None:
        """``_uninitialised`` asked until the ps answer, within ``answer_within`` seconds."""
        deadline = time.monotonic() + self._answer_within
        for asked in itertools.count():
            missing = self._uninitialised()
            if missing is not None:
                return missing
            if time.monotonic() >= deadline:
                log.warning("chief: no ps answered whether it holds the variables within --sync_timeout "
                            "(%.0f s); restoring the newest checkpoint", self._answer_within)
                return None
            if asked == 0:
                log.info("chief: the ps did not answer whether they hold the variables (a ps away or slow); "
                         "asking again for up to --sync_timeout (%.0f s)", self._answer_within)
            time.sleep(timeouts.GIVE_UP_POLL_SECS)
        return None

    def create_session(self):
        scaffold = compat.session_creator_scaffold(self).finalize()
        skip, self._skip_probe = self._skip_probe, False
        missing = None if skip else self._probe()
        if missing == []:
            sm = v1.train.SessionManager(
                local_init_op=scaffold.local_init_op, ready_op=scaffold.ready_op,
                ready_for_local_init_op=scaffold.ready_for_local_init_op,
                graph=v1.get_default_graph(), recovery_wait_secs=timeouts.JOIN_POLL_SECS)
            session = sm.wait_for_session(compat.session_creator_master(self),
                                          config=compat.session_creator_config(self))
            step = int(session.run(self._global_step)) if self._global_step is not None else 0
            log.info("joined the live variables on the ps at step %d (nothing restored)", step)
            how, lost = "joined", []
        else:
            lost = sorted({p for p in (_ps_of(n, v1.get_default_graph()) for n in missing or []) if p})
            checkpoint_dir = compat.session_creator_checkpoint_dir(self)
            # the newest full checkpoint with its delta checkpoints applied (tfps.task.output.delta)
            checkpoint = delta.consolidate(checkpoint_dir) if checkpoint_dir else None
            session = super().create_session()
            step = checkpoint_step(checkpoint)
            how = "restored" if checkpoint else "initialised"
        self._drain_tokens(session)
        if self._on_session is not None:
            self._on_session(how, step, lost)
        return session

    def _drain_tokens(self, session) -> None:
        """Take out the previous chief's sync tokens (the chief hook then puts in fresh ones)."""
        if self._token_queue is None:
            return
        options = v1.RunOptions(timeout_in_ms=timeouts.REJOIN_PROBE_TIMEOUT_MS)
        taken = 0
        try:
            while taken < DRAIN_LIMIT and int(session.run(self._size, options=options)) > 0:
                session.run(self._drain, options=options)
                taken += 1
        except tf.errors.OpError as e:
            log.debug("draining the sync token queue stopped: %s", e.message.splitlines()[0])
        if taken:
            log.info("took %d stale sync token(s) out of the queue", taken)
