#define SPECULA_ISA generic
#include "runtime/kernels/attention_body.inc"
