"""Development and test tooling, kept out of the runtime packages (which never import it).

- :mod:`devtools.binaries`: where the tansu broker and redis-server binaries come from;
- :mod:`devtools.processes`: starting, stopping and watching service processes (/proc liveness),
  and the state file of a running stack;
- :mod:`devtools.probes`: readiness probes (Redis ``PING``, Kafka metadata and a produce/fetch
  round trip);
- :mod:`devtools.stack`: :class:`~devtools.stack.LocalStack`, the broker + Redis pair on free
  local ports (``ldp stack``, ``ldp demo``, the benchmarks, the tests' ``local_stack`` fixture);
- :mod:`devtools.objectstore`: a small S3-compatible object server keeping files in the run dir,
  the storage of the durable local broker (tansu's ``s3://`` engine);
- :mod:`devtools.cluster`: :class:`~devtools.cluster.LocalRedisCluster`, a local 3-master Redis Cluster
  (its ``url`` is a ``redis+cluster://`` URL the workers and the count store accept);
- :mod:`devtools.workers`: :class:`~devtools.workers.WorkerProcess`, a stream-app worker in a child
  process, and helpers that read back counts from Redis.
"""
