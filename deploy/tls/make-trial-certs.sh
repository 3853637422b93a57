#!/usr/bin/env bash
# Self-signed TLS material for a TRIAL of the compose stack: a throwaway CA, a certificate per Kafka broker
# (kafka-1..3, in PKCS12 keystores) and the certificate of the ingest's TLS front (nginx). In production, put
# files from your own CA at the same paths instead (deploy/README.md, "TLS").
#
#   deploy/tls/make-trial-certs.sh                      # into deploy/secrets/tls/ (git-ignored)
#   deploy/tls/make-trial-certs.sh OUT_DIR
#   LDP_INGEST_TLS_NAMES=ingest.example.org,localhost deploy/tls/make-trial-certs.sh
#
# Writes (an existing file is replaced: the set belongs together):
#   ca.pem                  the CA certificate: every Kafka client (LDP_KAFKA_CAFILE) and the devices trust it
#   ca.key                  its key (mode 600, mounted nowhere): keep it to issue more, or delete it
#   kafka-N.p12             broker N's key and certificate (SAN DNS:kafka-N, DNS:localhost), PKCS12
#   keystore_password       the password of the three keystores
#   ingest.crt, ingest.key  the ingest front's certificate (SAN: LDP_INGEST_TLS_NAMES, default localhost, and
#                           IP:127.0.0.1) and key
# Keys are ECDSA P-256; certificates are valid LDP_TRIAL_CERT_DAYS days (default 90).
set -euo pipefail

out="${1:-$(cd "$(dirname "$0")/.." && pwd)/secrets/tls}"
days="${LDP_TRIAL_CERT_DAYS:-90}"
ingest_names="${LDP_INGEST_TLS_NAMES:-localhost}"
brokers=(kafka-1 kafka-2 kafka-3)

mkdir -p "$out"
chmod 700 "$out" "$(dirname "$out")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
umask 077

# the CA
openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -sha256 -days "$days" \
  -subj "/CN=ldp-stream trial CA" -keyout "$out/ca.key" -out "$out/ca.pem" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

# sign NAME SAN: a key and a certificate for a server, signed by the CA
sign() {
  local name="$1" san="$2"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -sha256 -subj "/CN=$name" \
    -keyout "$work/$name.key" -out "$work/$name.csr" 2>/dev/null
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=%s\n' \
    "$san" > "$work/$name.ext"
  openssl x509 -req -in "$work/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" -CAcreateserial \
    -CAserial "$work/ca.srl" -days "$days" -sha256 -extfile "$work/$name.ext" -out "$work/$name.crt" 2>/dev/null
}

# the brokers: PKCS12 keystores (the Kafka image's JVM reads them; key password = store password)
openssl rand -hex 24 > "$out/keystore_password"
for b in "${brokers[@]}"; do
  sign "$b" "DNS:$b,DNS:localhost"
  openssl pkcs12 -export -name "$b" -inkey "$work/$b.key" -in "$work/$b.crt" -certfile "$out/ca.pem" \
    -passout "file:$out/keystore_password" -out "$out/$b.p12"
done

# the ingest's TLS front
san="IP:127.0.0.1"
IFS=',' read -ra names <<< "$ingest_names"
for n in "${names[@]}"; do
  [[ -n "$n" ]] && san="DNS:$n,$san"
done
sign ingest "$san"
cat "$work/ingest.crt" "$out/ca.pem" > "$out/ingest.crt"   # the chain the devices are sent
cp "$work/ingest.key" "$out/ingest.key"

# read by the containers' own non-root users (not the host owner): 644 inside the 700 directories; not the CA key
chmod 644 "$out/ca.pem" "$out/keystore_password" "$out/ingest.crt" "$out/ingest.key" "$out"/kafka-*.p12
chmod 600 "$out/ca.key"
echo "made the trial CA and certificates in $out (valid $days days; ingest names: $ingest_names)"
