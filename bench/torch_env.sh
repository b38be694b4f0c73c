# Sourced by the benchmarks that run PyTorch beside memfit: PyTorch in its
# best set-up on this machine, and the same BLAS environment for both.
#  - libtcmalloc_minimal is preloaded for PyTorch (LD_PRELOAD): with glibc's
#    malloc PyTorch returns its large tensors to the kernel after each step
#    and faults them in again the next, which halves its speed here.
#  - OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset for both (these
#    machines export Haswell and 512, which pick kernels narrower than the
#    CPU's; unset, memfit picks its kernels itself and PyTorch's OpenBLAS
#    autodetects).
# Sets CLEAN (an env command prefix for both systems), TORCH_ENV (env
# arguments for PyTorch: the unsets and the preload) and TCMALLOC; prints
# nothing. A missing libtcmalloc stops the benchmark: a PyTorch baseline
# without it would not be PyTorch's best.
TCMALLOC=${TCMALLOC:-$(ls /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 /usr/lib/*/libtcmalloc_minimal.so.4 2>/dev/null | head -1 || true)}
if [ -z "$TCMALLOC" ] || [ ! -f "$TCMALLOC" ]; then
  echo "$(basename "$0"): libtcmalloc_minimal.so.4 not found (apt-get install libtcmalloc-minimal4, or set TCMALLOC=PATH)" >&2
  exit 1
fi
CLEAN=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
TORCH_ENV=(-u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE LD_PRELOAD="$TCMALLOC")
