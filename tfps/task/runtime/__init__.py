"""The task's process: signals and stops, the done queue, session settings, the health file,
the ``--restarts`` supervisor, the watchdog, the session's hooks and creators, and the
faults of disk and data a running task meets."""
