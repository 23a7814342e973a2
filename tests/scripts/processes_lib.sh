# What the scripts that start cluster processes share: a work directory, the
# processes they start (append each pid to $pids) and a cleanup on any exit
# that stops them (SIGTERM, SIGKILL after 5 s) and removes the directory.
# The caller sets $bin and sources this file after `set -euo pipefail`.

work=$(mktemp -d)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

# Exits 0 with a SKIP line when one of the binaries is not built.
skip_unless_built() {
  local b
  for b in "$@"; do
    if [[ ! -x "$bin/$b" ]]; then
      echo "SKIP: $bin/$b is not built yet (scripts/build.sh builds it)"
      echo "0 passed, 0 failed"
      exit 0
    fi
  done
}
