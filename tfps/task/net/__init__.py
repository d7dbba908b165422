"""The network guards: a TensorFlow server on a loopback address stays on loopback
(``loopback``), checked from the kernel's own sockets (``listening``), also for a classic
script's server (``script_guard``). docs/design/loopback.md says why."""
