#!/usr/bin/env bash
# Packs what bench/device_check.sh needs on a GPU machine that has none of
# our Debian libraries: the CUDA test binaries, gpu_bench, gpipectl and the
# controller and worker it starts for the pipeline check, pipeline_bench
# (the schedules at K=4 on that machine's cores), every
# shared library they load (glibc and its loader included, so the binaries
# run on any x86-64 Linux) except the NVIDIA driver (libcuda) and cuBLAS /
# cuDNN, which that machine has in its CUDA toolkit or in python's nvidia-*
# packages; and the bench specs. One xz tarball plus the check script go to
# DEST (default /work/main/.devcarry, ignored by git there).
#   bench/device_pack.sh [DEST]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-/work/main/.devcarry}
bins=(cuda_kernels_test cuda_layers_test cuda_cnn_test cuda_cudnn_test
      tensor_caching_allocator_test cuda_ipc_link_test cuda_ipc_plane_test
      gpu_bench gpipectl gpipe-controller gpipe-worker pipeline_bench)
scripts/build.sh "${bins[@]}" >/dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/bench"
for b in "${bins[@]}"; do
  path=$(find build -type f -name "$b" -perm -u+x | head -1)
  [[ -n $path ]] || { echo "device_pack: $b was not built" >&2; exit 1; }
  strip -o "$stage/bin/$b" "$path"
done
# Every library the loader resolves, but not the driver's or NVIDIA's math
# libraries (found on the GPU machine at run time).
for b in "$stage"/bin/*; do
  ldd "$b" | awk '/=>/ {print $3} /ld-linux/ {print $1}'
done | sort -u | while read -r lib; do
  [[ -f $lib ]] || continue
  case $(basename "$lib") in
    libcuda.so* | libcublas* | libcudnn* | libnvidia*) continue ;;
  esac
  cp -L "$lib" "$stage/lib/"
done
cp bench/gpu_mlp.json bench/gpu_wide_mlp.json bench/gpu_cnn.json \
  bench/gpu_pipe_mlp.json bench/torch_pipelining.py \
  examples/char_transformer.json examples/fashion_mnist_cnn.json "$stage/bench/"
mkdir -p "$dest"
rm -f "$dest"/gpipe-device.tar.xz
tar -C "$stage" -cf - . | xz -T2 -6 > "$dest/gpipe-device.tar.xz"
cp bench/device_check.sh "$dest/device_check.sh"
echo "device_pack: $(du -h "$dest/gpipe-device.tar.xz" | cut -f1) in" \
     "$dest/gpipe-device.tar.xz ($(ls "$stage/lib" | wc -l) libraries)"
