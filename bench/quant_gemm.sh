#!/usr/bin/env bash
# Builds and runs bench/quant_gemm.c (frozen-base tile-dequant GEMMs against
# fp32 sgemm at gpt2-124m shapes, M = 1024), printing the machine, the load
# before and after, and the table. Needs build/libmemfit.a (`make`).
#   bash bench/quant_gemm.sh [reps]          # OMP_NUM_THREADS as set (default: all cores)
set -eu
cd "$(dirname "$0")/.."
[ -f build/libmemfit.a ] || { echo "quant_gemm.sh: build/libmemfit.a missing, run make first" >&2; exit 1; }
gcc -std=c11 -D_GNU_SOURCE -O2 -fopenmp -Iinclude -Isrc -I/usr/include/x86_64-linux-gnu/openblas-openmp \
    bench/quant_gemm.c build/libmemfit.a -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -ldnnl -lm \
    -o build/quant_gemm
echo "$(date -u '+%F %T') UTC; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
build/quant_gemm "${1:-9}"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
