#define SPECULA_ISA avx512
#include "runtime/kernels/attention_body.inc"
