/* The dispatched kernels for any x86-64 (or other) CPU: kern_body.h built
 * with the project's baseline flags. See isa.h. */
#define MF_ISA(x) x##_portable
#define MF_ISA_NAME "portable"
#include "kern_body.h"
