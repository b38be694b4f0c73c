# Sourced by the MPI tests: how to start N ranks of memfit on this machine.
# --oversubscribe: more ranks than cores is fine for tests; as root Open
# MPI wants --allow-run-as-root; CMA single-copy needs ptrace rights that
# containers often lack, so shared memory copies through its FIFOs.
MPIRUN=(mpirun --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
# Open MPI's own allocations are not memfit's to free
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
command -v mpirun >/dev/null || { echo "mpirun not found: apt-get install openmpi-bin libopenmpi-dev"; exit 1; }
