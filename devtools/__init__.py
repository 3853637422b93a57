"""Development and test tooling, kept out of the runtime packages (which never import it).

- :mod:`devtools.binaries`: where the tansu broker and redis-server binaries come from;
- :mod:`devtools.processes`: starting, stopping and watching service processes (/proc liveness),
  and the state file of a running stack;
- :mod:`devtools.probes`: readiness probes (Redis ``PING``, Kafka metadata and a produce/fetch
  round trip);
- :mod:`devtools.stack`: :class:`~devtools.stack.LocalStack`, the broker + Redis pair on free
  local ports (``ldp stack``, ``ldp demo``, the benchmarks, the tests' ``local_stack`` fixture);
- :mod:`devtools.workers`: :class:`~devtools.workers.WorkerProcess`, a stream-app worker in a child
  process, and helpers that read back counts from Redis.
"""
