"""Development and test tooling, kept out of the runtime packages (which never import it).

- :mod:`ldpstream_dev.binaries`: where the tansu broker and redis-server binaries come from;
- :mod:`ldpstream_dev.processes`: starting, stopping and watching service processes (/proc liveness),
  and the state file of a running stack;
- :mod:`ldpstream_dev.probes`: readiness probes (Redis ``PING``, Kafka metadata and a produce/fetch
  round trip);
- :mod:`ldpstream_dev.stack`: :class:`~ldpstream_dev.stack.LocalStack`, the broker + Redis pair on free
  local ports (``ldp stack``, ``ldp demo``, the benchmarks, the tests' ``local_stack`` fixture);
- :mod:`ldpstream_dev.objectstore`: a small S3-compatible object server keeping files in the run dir,
  the storage of the durable local broker (tansu's ``s3://`` engine);
- :mod:`ldpstream_dev.cluster`: :class:`~ldpstream_dev.cluster.LocalRedisCluster`, a local 3-master Redis Cluster
  (its ``url`` is a ``redis+cluster://`` URL the workers and the count store accept);
- :mod:`ldpstream_dev.workers`: :class:`~ldpstream_dev.workers.WorkerProcess`, a stream-app worker in a child
  process, and helpers that read back counts from Redis.
"""
