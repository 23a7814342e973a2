#!/usr/bin/env bash
# Makes the Debian 12 base images the Dockerfiles build on, on a machine
# that reaches Debian's package mirror but no container registry: a minimal
# Debian root file system from mmdebstrap, imported into the engine.
#   deploy/docker/base-image.sh [--engine podman|docker] [--force] [--cuda]
# Images (tags of the local engine; skipped when present, unless --force;
# GPIPE_BASE_REPO changes the localhost/gpipe-base prefix):
#   localhost/gpipe-base/debian:12        build stage (DEBIAN_BUILD_IMAGE)
#   localhost/gpipe-base/debian:12-slim   runtime stage (DEBIAN_RUNTIME_IMAGE)
# With --cuda also, from the CUDA toolkit this machine builds with
# ($CUDA_HOME, default /usr/local/cuda):
#   localhost/gpipe-base/cuda:13-devel    the toolkit (CUDA_BUILD_IMAGE)
#   localhost/gpipe-base/cuda:13-runtime  only the shared libraries the
#                                         workers load (CUDA_RUNTIME_IMAGE)
# Then build with, for example:
#   podman build --format docker -f deploy/docker/Dockerfile -t gpipe:dev \
#     --build-arg DEBIAN_BUILD_IMAGE=localhost/gpipe-base/debian:12 \
#     --build-arg DEBIAN_RUNTIME_IMAGE=localhost/gpipe-base/debian:12-slim .
# With a registry at hand none of this is needed: the Dockerfiles' defaults
# (debian:12.8, nvidia/cuda:13.0.0-cudnn-*) are the same bases, pulled.
#
# Both Debian tags are one root file system: the minbase variant (apt, dpkg,
# bash, coreutils) with documentation, manuals and translations left out as
# Debian's slim images do; the build stage adds its compilers with apt.
set -euo pipefail
engine=podman
force=0
cuda=0
while (($#)); do
  case "$1" in
    --engine) engine=$2; shift 2 ;;
    --force) force=1; shift ;;
    --cuda) cuda=1; shift ;;
    *) echo "base-image.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v "$engine" >/dev/null || { echo "base-image.sh: no $engine" >&2; exit 2; }
repo=${GPIPE_BASE_REPO:-localhost/gpipe-base}
debian=$repo/debian:12
slim=$repo/debian:12-slim
have() { "$engine" image exists "$1" 2>/dev/null || "$engine" image inspect "$1" >/dev/null 2>&1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if ((force)) || ! have "$debian" || ! have "$slim"; then
  command -v mmdebstrap >/dev/null ||
    { echo "base-image.sh: needs mmdebstrap (Debian package mmdebstrap)" >&2; exit 2; }
  echo "base-image.sh: Debian 12 minbase from the package mirror (about a minute)"
  mmdebstrap --variant=minbase --quiet \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --aptopt='APT::Install-Recommends "false"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    bookworm "$work/rootfs.tar"
  version=$(tar -xOf "$work/rootfs.tar" ./etc/debian_version)
  # An imported file system has no environment: PATH as Debian's images set it.
  "$engine" import -q --change 'CMD ["/bin/bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change "LABEL org.opencontainers.image.version=$version" \
    --change "LABEL org.opencontainers.image.created=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    "$work/rootfs.tar" "$debian" >/dev/null
  "$engine" tag "$debian" "$slim"
  echo "base-image.sh: $debian and $slim (Debian $version)"
else
  echo "base-image.sh: $debian and $slim present (--force remakes them)"
fi

((cuda)) || exit 0
cuda_home=${CUDA_HOME:-/usr/local/cuda}
cuda_home=$(readlink -f "$cuda_home")
[[ -x "$cuda_home/bin/nvcc" ]] ||
  { echo "base-image.sh: no CUDA toolkit at $cuda_home (set CUDA_HOME)" >&2; exit 2; }
devel=$repo/cuda:13-devel
runtime=$repo/cuda:13-runtime
if ((force)) || ! have "$devel" || ! have "$runtime"; then
  # The toolkit as it is installed here, at the same path, on the Debian
  # base: the build stage compiles exactly as this machine does.
  mkdir -p "$work/ctx"
  echo "base-image.sh: $devel from $cuda_home ($(du -sh "$cuda_home" | cut -f1))"
  cat >"$work/Containerfile.devel" <<EOF
FROM $debian
COPY cuda/ $cuda_home/
RUN ln -s $cuda_home /usr/local/cuda
ENV PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib
EOF
  cp -a "$cuda_home" "$work/ctx/cuda"
  "$engine" build -q -f "$work/Containerfile.devel" -t "$devel" "$work/ctx" >/dev/null
  rm -rf "$work/ctx"
  # Runtime: the CUDA runtime, cuBLAS and cuDNN (all of its engine
  # libraries: cuDNN loads them by name at run time), nothing to compile.
  mkdir -p "$work/rt/lib"
  for lib in libcudart libcublas libcublasLt libcudnn libnvJitLink libnvrtc; do
    find "$cuda_home/lib64/" "$cuda_home/lib/" -maxdepth 1 -name "$lib*.so*" \
      -exec cp -a {} "$work/rt/lib/" \; 2>/dev/null || true
  done
  cat >"$work/Containerfile.runtime" <<EOF
FROM $slim
COPY lib/ /usr/local/cuda/lib64/
RUN echo /usr/local/cuda/lib64 >/etc/ld.so.conf.d/cuda.conf && ldconfig
EOF
  "$engine" build -q -f "$work/Containerfile.runtime" -t "$runtime" "$work/rt" >/dev/null
  echo "base-image.sh: $devel and $runtime"
else
  echo "base-image.sh: $devel and $runtime present (--force remakes them)"
fi
