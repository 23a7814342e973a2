#!/bin/sh
# gpipe-entrypoint: runs one of the image's binaries with flags from the
# command line and from the environment.
#   gpipe-entrypoint gpipe-controller|gpipe-worker|gpipectl [FLAG...]
# An environment variable GPIPE_CONTROLLER_<FLAG> (for gpipe-controller),
# GPIPE_WORKER_<FLAG> (gpipe-worker) or GPIPE_CTL_<FLAG> (gpipectl) becomes
# --<flag>=VALUE, the flag name lower-cased: GPIPE_WORKER_THREADS=4 is
# --threads=4. Flags on the command line come after them, so they win.
# The binary is exec'd: it is PID 1 and gets SIGTERM itself (it drains).
set -eu

if [ "$#" -eq 0 ]; then
  echo "usage: gpipe-entrypoint gpipe-controller|gpipe-worker|gpipectl [FLAG...]" >&2
  exit 2
fi
binary=$1
shift
case "$binary" in
  gpipe-controller) prefix=GPIPE_CONTROLLER_ ;;
  gpipe-worker) prefix=GPIPE_WORKER_ ;;
  gpipectl) prefix=GPIPE_CTL_ ;;
  *)
    # Anything else (a shell for debugging, say) runs as it is.
    exec "$binary" "$@"
    ;;
esac

# Environment flags go first, in name order (prepended in reverse); a
# newline-free value is assumed (flags are). Kubernetes' service links
# share the prefix (a Service gpipe-controller gives every pod after it
# GPIPE_CONTROLLER_SERVICE_HOST, _PORT, _PORT_7070_TCP_ADDR ...): they are
# no flags, and passed as ones the binary would exit on an unknown flag.
env_flags=$(env | sed -n "s/^${prefix}\([A-Z0-9_]*\)=\(.*\)$/\1=\2/p" |
  grep -Ev '^(SERVICE_HOST|SERVICE_PORT|SERVICE_PORT_[A-Z0-9_]+|PORT|PORT_[0-9]+_[A-Z0-9_]+)=' |
  sort -r || true)
if [ -n "$env_flags" ]; then
  old_ifs=$IFS
  IFS='
'
  for pair in $env_flags; do
    name=$(printf '%s' "${pair%%=*}" | tr 'A-Z' 'a-z')
    set -- "--${name}=${pair#*=}" "$@"
  done
  IFS=$old_ifs
fi
# gpipectl parses flags anywhere on its line: `--controller=X submit JOB`
# works as `submit JOB --controller=X` does.
exec "$binary" "$@"
