#define SPECULA_ISA neon
#define SPECULA_ATTENTION_NEON
#include "runtime/kernels/attention_body.inc"
