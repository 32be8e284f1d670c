// kernels/matmul.h's integer formats with `smmla` (ARMv8.6 i8mm) for token pairs, `sdot` for an
// odd token (matmul_neon_body.h); quantize_activations and the float formats are neon_dotprod's.
#define SPECULA_NEON_NS neon_i8mm
#include "runtime/kernels/matmul_neon_body.h"
