#pragma once
// Per-instruction-set bodies of kernels/attention.h; internal to the kernels.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

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

// The pair loop the intrinsic bodies share: body(i, kvh, visible, out) for each (row i, KV head
// kvh) pair of [pair_begin, pair_end), with the row's visible slots (ascending, at least one) and
// its output's first of G * D floats; a row that sees nothing gets zeros, not NaN (the engine
// never produces one). A verify block's rows each find their visible slots once for all their KV
// heads; a prefill chunk's (many rows, each list as long as the context) are found per pair.
// find_visible(mask row, n_kv, list) is the body's own mask scan.
template <class FindVisible, class Body>
inline void for_each_pair(const AttentionArgs & a, int64_t pair_begin, int64_t pair_end, FindVisible find_visible, Body body) {
    constexpr int kListedRows = 64;
    thread_local std::vector<std::vector<int>> visible_of;
    thread_local std::vector<int> visible_now;
    const int64_t width = static_cast<int64_t>(a.n_head) / a.n_head_kv * a.head_dim;
    const bool listed = a.n_rows <= kListedRows;
    if (listed) {
        if (static_cast<int>(visible_of.size()) < a.n_rows) visible_of.resize(a.n_rows);
        const int64_t first = pair_begin % a.n_rows, count = std::min<int64_t>(a.n_rows, pair_end - pair_begin);
        for (int64_t r = 0; r < count; ++r) {
            const int64_t i = (first + r) % a.n_rows;
            find_visible(a.mask + i * a.mask_row, a.n_kv, visible_of[i]);
        }
    }
    for (int64_t pair = pair_begin; pair < pair_end; ++pair) {
        const int64_t i = pair % a.n_rows;
        const int kvh = static_cast<int>(pair / a.n_rows);
        if (!listed) find_visible(a.mask + i * a.mask_row, a.n_kv, visible_now);
        const std::vector<int> & visible = listed ? visible_of[i] : visible_now;
        float * o = a.out + i * a.out_row + kvh * width;
        if (visible.empty()) {
            std::memset(o, 0, sizeof(float) * width);
            continue;
        }
        body(i, kvh, visible, o);
    }
}

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
