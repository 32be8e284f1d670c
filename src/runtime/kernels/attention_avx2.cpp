#define SPECULA_ISA avx2
#include "runtime/kernels/attention_body.inc"
