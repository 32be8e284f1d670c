#pragma once
// Per-instruction-set bodies of kernels/attention.h; internal to the kernels.
#include <cstdint>

#include "runtime/kernels/matmul.h"

namespace specula::kernels {

struct AttentionArgs {
    const float * q = nullptr;  // row i, head h at q + i * q_row + h * D
    int64_t q_row = 0;
    const uint16_t * k = nullptr;  // F16; slot s, KV head g at k + s * kv_row + g * D
    const uint16_t * v = nullptr;
    int64_t kv_row = 0;
    const uint16_t * mask = nullptr;  // F16 [n_kv] per row
    int64_t mask_row = 0;
    int n_kv = 0;
    int n_rows = 0;  // query rows
    int head_dim = 0, n_head = 0, n_head_kv = 0;
    float scale = 1.0f;
    float * out = nullptr;  // row i, head h at out + i * out_row + h * D
    int64_t out_row = 0;
};

// (row, KV head) pairs [pair_begin, pair_end) on the given path's body (one the CPU can run).
// Pair p is row p % n_rows of KV head p / n_rows: a thread's run of pairs takes one KV head's
// rows in turn, and that head's keys and values, read from beyond L2 deep in a context, are read
// there once and then stay near for its other rows.
void attend_on(CpuPath path, const AttentionArgs & a, int64_t pair_begin, int64_t pair_end);

namespace generic {
void attend(const AttentionArgs & a, int64_t pair_begin, int64_t pair_end);
}
namespace avx2 {
void attend(const AttentionArgs & a, int64_t pair_begin, int64_t pair_end);
}
namespace avx512 {
void attend(const AttentionArgs & a, int64_t pair_begin, int64_t pair_end);
}
namespace neon {
void attend(const AttentionArgs & a, int64_t pair_begin, int64_t pair_end);
}

}  // namespace specula::kernels
