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
libs=$(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u)
# Alternatives (libblas, libopenblas) resolve to the real file, and on a
# merged /usr one file may be registered under /lib or /usr/lib: ask dpkg
# about every spelling at once (one dpkg call: each one reads its database).
declare -A spellings=()
for lib in $libs; do
  real=$(readlink -f "$lib")
  spellings[$lib]="$real /usr$real ${real#/usr} $lib"
done
owners=$(dpkg -S ${spellings[@]+${spellings[@]}} 2>/dev/null || true)
for lib in $libs; do
  pkg=""
  for path in ${spellings[$lib]}; do
    pkg=$(awk -v p="$path" '{ f = $NF } f == p { sub(/:.*/, "", $1); print $1; exit }' <<<"$owners")
    [[ -n "$pkg" ]] && break
  done
  if [[ -n "$pkg" ]]; then
    echo "$pkg"
    continue
  fi
  # CUDA libraries of an nvidia/cuda base image are in the runtime base
  # already; anything else nobody owns is an error worth seeing.
  case "$lib" in
    */cuda*|*/libcu*|*/libnv*) ;;
    *) echo "runtime-packages.sh: no package owns $lib" >&2; exit 1 ;;
  esac
done | sort -u
