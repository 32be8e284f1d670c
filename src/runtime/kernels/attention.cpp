#include "runtime/kernels/attention.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "specula/error.h"
#include "ggml.h"
#include "runtime/kernels/attention_impl.h"
#include "runtime/kernels/matmul.h"

namespace specula::kernels {

namespace {

constexpr int kMaxGroup = 64;  // query heads per KV head that attend() keeps sums for

void attention_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const ggml_tensor * mask = dst->src[3];
    AttentionArgs a;
    a.head_dim = static_cast<int>(q->ne[0]);
    a.n_head = static_cast<int>(q->ne[1]);
    a.n_head_kv = static_cast<int>(k->ne[0] / q->ne[0]);
    a.q = static_cast<const float *>(q->data);
    a.q_row = static_cast<int64_t>(q->nb[2] / sizeof(float));
    a.k = static_cast<const uint16_t *>(k->data);
    a.v = static_cast<const uint16_t *>(v->data);
    a.kv_row = static_cast<int64_t>(k->nb[1] / sizeof(uint16_t));
    a.mask = static_cast<const uint16_t *>(mask->data);
    a.mask_row = static_cast<int64_t>(mask->nb[1] / sizeof(uint16_t));
    a.n_kv = static_cast<int>(mask->ne[0]);
    a.scale = std::bit_cast<float>(static_cast<uint32_t>(reinterpret_cast<uintptr_t>(userdata)));
    a.out = static_cast<float *>(dst->data);
    a.out_row = static_cast<int64_t>(dst->nb[1] / sizeof(float));
    const CpuPath path = detected_cpu_path();
    const int64_t rows = q->ne[2];
    a.n_rows = static_cast<int>(rows);
    const int64_t pairs = rows * a.n_head_kv;
    if (pairs >= 4 * nth) return attend_on(path, a, pairs * ith / nth, pairs * (ith + 1) / nth);
    // Few (row, KV head) pairs for the threads (one decoded token has n_head_kv of them): split by
    // query head instead, each thread's heads in runs that share a row and a KV head. Each head's
    // sums are its own whichever heads share a pass, so the bits are the same.
    const int G = a.n_head / a.n_head_kv;
    const int64_t units = rows * a.n_head, end = units * (ith + 1) / nth;
    for (int64_t u = units * ith / nth; u < end;) {
        const int64_t i = u / a.n_head;
        const int h = static_cast<int>(u % a.n_head);
        const int run = static_cast<int>(std::min<int64_t>(end - u, G - h % G));
        AttentionArgs part = a;  // heads h..h+run of one KV head, as that KV head's whole group
        part.q = a.q + static_cast<int64_t>(h) * a.head_dim;
        part.out = a.out + static_cast<int64_t>(h) * a.head_dim;
        part.k = a.k + static_cast<int64_t>(h / G) * a.head_dim;
        part.v = a.v + static_cast<int64_t>(h / G) * a.head_dim;
        part.n_head = run;
        part.n_head_kv = 1;
        attend_on(path, part, i, i + 1);  // with one KV head, pair i is row i
        u += run;
    }
}

}  // namespace

void attend_on(CpuPath path, const AttentionArgs & a, int64_t pair_begin, int64_t pair_end) {
#if defined(SPECULA_X86_KERNELS)
    switch (path) {
        case CpuPath::Avx512Vnni: return avx512::attend(a, pair_begin, pair_end);
        case CpuPath::Avx2: return avx2::attend(a, pair_begin, pair_end);
        default: break;
    }
#endif
#if defined(SPECULA_ARM64_KERNELS)
    if (path == CpuPath::NeonDotprod || path == CpuPath::NeonI8mm) return neon::attend(a, pair_begin, pair_end);
#endif
    generic::attend(a, pair_begin, pair_end);
}

bool attention_supported(int head_dim) { return head_dim > 0 && head_dim % 16 == 0; }

ggml_tensor * masked_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k_cache, ggml_tensor * v_cache,
                               ggml_tensor * mask, float scale) {
    const int64_t D = q->ne[0];
    if (!attention_supported(static_cast<int>(D))) throw Error("masked_attention: head size must be a multiple of 16");
    if (q->type != GGML_TYPE_F32 || !ggml_is_contiguous(q)) throw Error("masked_attention: q must be contiguous F32");
    if (k_cache->type != GGML_TYPE_F16 || v_cache->type != GGML_TYPE_F16 || mask->type != GGML_TYPE_F16) {
        throw Error("masked_attention: K/V cache and mask must be F16");
    }
    if (k_cache->ne[0] % D != 0 || q->ne[1] % (k_cache->ne[0] / D) != 0 || q->ne[1] / (k_cache->ne[0] / D) > kMaxGroup ||
        v_cache->ne[0] != k_cache->ne[0] || mask->ne[1] < q->ne[2] || mask->ne[0] > k_cache->ne[1]) {
        throw Error("masked_attention: q, cache and mask shapes do not fit");
    }
    ggml_tensor * args[4] = {q, k_cache, v_cache, mask};
    // The scale travels in the userdata pointer's bits: a graph node carries no other payload.
    void * scale_bits = reinterpret_cast<void *>(static_cast<uintptr_t>(std::bit_cast<uint32_t>(scale)));
    return ggml_custom_4d(ctx, GGML_TYPE_F32, D * q->ne[1], q->ne[2], 1, 1, args, 4, attention_op, GGML_N_TASKS_MAX, scale_bits);
}

}  // namespace specula::kernels
