#!/usr/bin/env bash
# The passwords and the device-token secret of the compose stack, one file each, made once before the first
# `docker compose up` (deploy/README.md, "Secrets"):
#
#   deploy/make-secrets.sh                # into deploy/secrets/ (git-ignored); an existing file is never replaced
#   deploy/make-secrets.sh OTHER_DIR      # elsewhere (then point docker-compose.yml's `secrets:` at it)
#
# Each is 32 random bytes in hex (openssl rand). Every service mounts only the ones it uses (docker-compose.yml):
#   kafka_admin_password     brokers (inter-broker and controller login, PLAIN over TLS) and kafka-init
#   kafka_ingest_password    the ingest's Kafka login (SCRAM-SHA-512; writes ldp.reports)
#   kafka_producer_password  the simulated fleet's Kafka login (profile "demo"; writes ldp.reports)
#   kafka_worker_password    the workers' Kafka login (reads ldp.reports, writes ldp.estimates / ldp.rejected)
#   kafka_exporter_password  the Kafka exporter's login (describes topics and groups, reads nothing)
#   redis_password           Redis requirepass; the workers, the ingest and the Redis exporter
#   device_secret            the ingest's device-token key (`ldp tokens`)
#   grafana_admin_password   Grafana's admin user
# kafka-init reads the four Kafka role passwords once, to register their SCRAM logins (the brokers keep salted
# hashes only). The TLS files (CA, broker keystores, the ingest's certificate) come from your CA, or for a trial
# from deploy/tls/make-trial-certs.sh.
#
# Modes: the directory 700, the files 644: the containers read them as their own non-root users (Kafka uid 1000,
# the ldp image 10001, Grafana 472 ...), which are not the file's owner on the host.
set -euo pipefail

dir="${1:-$(cd "$(dirname "$0")" && pwd)/secrets}"
names=(kafka_admin_password kafka_ingest_password kafka_producer_password kafka_worker_password
       kafka_exporter_password redis_password device_secret grafana_admin_password)

mkdir -p "$dir"
chmod 700 "$dir"
for name in "${names[@]}"; do
  file="$dir/$name"
  if [[ -s "$file" ]]; then
    echo "kept    $file"
    continue
  fi
  (umask 077 && openssl rand -hex 32 > "$file")
  chmod 644 "$file"
  echo "made    $file"
done
