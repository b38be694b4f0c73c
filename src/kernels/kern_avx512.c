/* The dispatched kernels for CPUs with AVX-512F/BW/VL/DQ: kern_body.h built
 * with those extensions enabled for this file only (CMakeLists.txt sets the
 * flags and MEMFIT_AVX512_TU), 512-bit vectors preferred. Nothing here runs
 * unless mf_kernels_isa_get() saw the CPU support it. See isa.h. */
#if defined(__x86_64__) && defined(MEMFIT_AVX512_TU)
#define MF_ISA(x) x##_avx512
#define MF_ISA_NAME "avx512"
#include "kern_body.h"
#else
typedef int mf_kern_avx512_unused; /* ISO C: a file must declare something */
#endif
