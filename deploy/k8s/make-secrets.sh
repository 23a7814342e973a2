#!/usr/bin/env bash
# Makes what a secured cluster needs (docs/security.md) with the openssl CLI:
# a CA, certificates for the controller, the workers and clients (gpipectl),
# and bearer tokens; with --apply also the Kubernetes Secrets that
# deploy/k8s/base mounts (with --yaml FILE the same Secrets as manifests in
# FILE instead, for podman kube play: deploy/podman).
#   deploy/k8s/make-secrets.sh DIR [--namespace gpipe] [--apply | --yaml FILE]
#                              [--days 365]
# DIR gets: ca.crt ca.key, {controller,worker,client}.{crt,key},
#   api.tokens (the job API's, for --api_token_file), worker.token (for
#   --worker_token_file and the workers' --token_file).
# Keep ca.key offline: it signs certificates for anyone.
#
# Certificate names: the controller's lists gpipe-controller and its
# in-cluster DNS names (workers and gpipectl dial the Service); the workers'
# is gpipe-worker, the name workers expect of each other (--tls_peer_name:
# they dial pod IPs, which no certificate can list). Both also list
# localhost and 127.0.0.1 for runs on one machine. Every certificate serves
# as server and client (mutual TLS).
set -euo pipefail
dir=${1:?usage: make-secrets.sh DIR [--namespace NS] [--apply | --yaml FILE] [--days N]}
shift
namespace=gpipe
apply=0
yaml=""
days=365
while (($#)); do
  case "$1" in
    --namespace) namespace=$2; shift 2 ;;
    --apply) apply=1; shift ;;
    --yaml) yaml=$2; shift 2 ;;
    --days) days=$2; shift 2 ;;
    *) echo "make-secrets.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v openssl >/dev/null || { echo "make-secrets.sh: needs the openssl CLI" >&2; exit 2; }
mkdir -p "$dir"
umask 077

# EC P-256: small keys, fast handshakes, supported by gRPC's BoringSSL and
# OpenSSL alike.
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

if [[ ! -f "$dir/ca.key" ]]; then
  key "$dir/ca.key"
  openssl req -x509 -new -key "$dir/ca.key" -sha256 -days "$days" \
    -subj "/CN=gpipe cluster CA" -out "$dir/ca.crt"
fi

# cert NAME DNS...: a certificate signed by the CA for NAME.
cert() {
  local name=$1 san="" d
  shift
  for d in "$@"; do san+="DNS:$d,"; done
  san+="DNS:localhost,IP:127.0.0.1"
  key "$dir/$name.key"
  openssl req -new -key "$dir/$name.key" -subj "/CN=gpipe-$name" -out "$dir/$name.csr"
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' \
    "$san" >"$dir/$name.ext"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -sha256 -days "$days" -extfile "$dir/$name.ext" \
    -out "$dir/$name.crt" 2>/dev/null
  rm -f "$dir/$name.csr" "$dir/$name.ext"
}
cert controller gpipe-controller "gpipe-controller.$namespace" \
  "gpipe-controller.$namespace.svc" "gpipe-controller.$namespace.svc.cluster.local"
cert worker gpipe-worker
cert client gpipe-client

# Tokens: 32 random bytes as hex. api.tokens may hold several (rotation:
# add the new one, roll the clients, remove the old one).
[[ -f "$dir/api.tokens" ]] ||
  printf '# job API tokens, one per line\n%s\n' "$(openssl rand -hex 32)" >"$dir/api.tokens"
[[ -f "$dir/worker.token" ]] || openssl rand -hex 32 >"$dir/worker.token"
grep -v '^#' "$dir/api.tokens" | grep -m1 . >"$dir/client.token"

if ((apply)) || [[ -n "$yaml" ]]; then
  # create --dry-run | apply: rerunning replaces the Secrets.
  if [[ -n "$yaml" ]]; then
    : >"$yaml"
    secret() {
      { echo "---"; kubectl -n "$namespace" create secret generic "$@" --dry-run=client -o yaml; } >>"$yaml"
    }
  else
    secret() { kubectl -n "$namespace" create secret generic "$@" --dry-run=client -o yaml | kubectl apply -f -; }
  fi
  for who in controller worker client; do
    secret "gpipe-$who-tls" --from-file=tls.crt="$dir/$who.crt" \
      --from-file=tls.key="$dir/$who.key" --from-file=ca.crt="$dir/ca.crt"
  done
  secret gpipe-tokens --from-file=api.tokens="$dir/api.tokens" \
    --from-file=worker.token="$dir/worker.token"
  secret gpipe-client-token --from-file=token="$dir/client.token"
fi
where=""
((apply)) && where=" and the Secrets in namespace $namespace"
[[ -n "$yaml" ]] && where=" and the Secrets' manifests in $yaml"
echo "made the CA, certificates and tokens in $dir$where"
