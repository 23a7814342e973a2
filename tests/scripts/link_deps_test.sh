#!/usr/bin/env bash
# The controller and the stage metrics link no kernels: neither their link
# lines nor their shared libraries name OpenBLAS, OpenMP, cuBLAS, cuDNN or
# the kernel-bearing libraries (gpipe_tensor, gpipe_tensor_cuda, gpipe_nn,
# gpipe_pipeline). The CUDA runtime may be there: tensors on a device need
# it for their copies, and it runs no kernel of ours.
#   link_deps_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }

forbidden_libs='libgpipe_tensor\.a|libgpipe_nn\.a|libgpipe_pipeline\.a|libgpipe_tensor_cuda|gpipe_cuda_kernels|openblas|gomp|libomp|cublas|cudnn'
forbidden_so='openblas|gomp|libomp|cublas|cudnn'

check() {
  local name=$1 binary=$2 link_txt=$3
  [[ -x $binary ]] || fail "$binary is not built"
  [[ -f $link_txt ]] || fail "no link line for $name ($link_txt)"
  if grep -oE "$forbidden_libs" "$link_txt" | sort -u | grep .; then
    fail "$name links the libraries above ($link_txt)"
  fi
  if ldd "$binary" | grep -E "$forbidden_so"; then
    fail "$name loads the shared libraries above"
  fi
  # The libraries it does link, for the log.
  echo "$name links: $(grep -oE 'libgpipe_[a-z_]+\.a' "$link_txt" | sort -u | tr '\n' ' ')"
}

check gpipe-controller "$build/bin/gpipe-controller" \
  "$build/controller/CMakeFiles/gpipe-controller.dir/link.txt"
check gpipe_metrics "$build/bin/metrics_link_probe" \
  "$build/tests/CMakeFiles/metrics_link_probe.dir/link.txt"
"$build/bin/metrics_link_probe" >/dev/null || fail "metrics_link_probe failed"

# The check can fail: gpipectl does link the kernels.
if ! grep -qE "$forbidden_libs" "$build/cli/CMakeFiles/gpipectl.dir/link.txt"; then
  fail "the check found no kernels in gpipectl's link line either: it checks nothing"
fi
echo "link_deps_test: the controller and the stage metrics link no kernels"
