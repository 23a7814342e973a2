#!/usr/bin/env bash
# Prints the Debian/Ubuntu packages that hold the shared libraries the given
# binaries load, one per line, so the runtime image installs exactly those
# (and not the -dev packages of the build stage).
#   runtime-packages.sh BINARY...
set -euo pipefail
(($#)) || { echo "usage: runtime-packages.sh BINARY..." >&2; exit 2; }
for b in "$@"; do
  [[ -x "$b" ]] || { echo "runtime-packages.sh: $b is not an executable" >&2; exit 1; }
done
ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  while read -r lib; do
    # Alternatives (libblas, libopenblas) resolve to the real file, and on a
    # merged /usr the same file may be registered under /lib or /usr/lib.
    real=$(readlink -f "$lib")
    for path in "$real" "/usr$real" "${real#/usr}" "$lib"; do
      if owner=$(dpkg -S "$path" 2>/dev/null); then
        echo "${owner%%:*}"
        continue 2
      fi
    done
    # CUDA libraries of an nvidia/cuda base image are already in the runtime
    # base; anything else unowned is an error worth seeing.
    case "$lib" in
      */cuda*|*/libcu*|*/libnv*) ;;
      *) echo "runtime-packages.sh: no package owns $lib" >&2; exit 1 ;;
    esac
  done | sort -u
