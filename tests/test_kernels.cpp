// specula's CPU kernels (runtime/kernels/): accuracy against a double-precision reference, and
// batch invariance to the bit, for the packed matmul alone and for the whole forward.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <random>

#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"
#include "runtime/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/kernels/attention_impl.h"
#include "runtime/kernels/matmul.h"
#include "runtime/kernels/matmul_impl.h"
#include "runtime/model.h"
#include "test_models.h"

namespace specula {
namespace {

using kernels::CpuPath;
using kernels::PackedMatrix;

struct Packed {
    PackedMatrix m;
    std::vector<uint8_t> bytes;
    std::vector<float> weights;  // the quantized weights, dequantized by ggml: [n_rows, k]
};

Packed make_packed(ggml_type type, int64_t n_rows, int64_t k, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(n_rows * k));
    for (float & x : w) x = normal(rng);
    std::vector<uint8_t> q(ggml_row_size(type, k) * n_rows);
    ggml_quantize_chunk(type, w.data(), q.data(), 0, n_rows, k, nullptr);
    Packed p;
    EXPECT_TRUE(kernels::packable(type, k, &p.m.format));
    p.m.source_type = type;
    p.m.k = k;
    p.m.n_rows = n_rows;
    p.bytes.resize(p.m.n_groups() * p.m.group_bytes());
    kernels::pack_matrix(p.m, q.data(), p.bytes.data());
    p.weights.resize(w.size());
    const auto * traits = ggml_get_type_traits(type);
    for (int64_t r = 0; r < n_rows; ++r) traits->to_float(q.data() + r * ggml_row_size(type, k), p.weights.data() + r * k, k);
    return p;
}

std::vector<float> random_activations(int n_tokens, int64_t k, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n_tokens * k));
    for (float & v : x) v = normal(rng);
    return x;
}

std::vector<float> run(CpuPath path, const Packed & p, const float * x, int n_tokens, std::vector<std::pair<int64_t, int64_t>> splits = {}) {
    std::vector<float> y(static_cast<size_t>(n_tokens * p.m.n_rows), NAN);
    if (splits.empty()) splits = {{0, p.m.n_groups()}};
    for (auto [g0, g1] : splits) kernels::matmul_groups(path, p.m, p.bytes.data(), x, p.m.k, n_tokens, y.data(), g0, g1);
    return y;
}

const ggml_type kTypes[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
                            GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_F16, GGML_TYPE_BF16};

// The paths this CPU can run: the generic one always, then every SIMD one it has. Printed once,
// since machines differ in which paths a comparison covers.
const std::vector<CpuPath> & paths() {
    static const std::vector<CpuPath> p = [] {
        std::vector<CpuPath> runnable;
        for (CpuPath path : {CpuPath::Generic, CpuPath::Avx2, CpuPath::Avx512Vnni, CpuPath::NeonDotprod, CpuPath::NeonI8mm}) {
            if (kernels::cpu_can_run(path)) runnable.push_back(path);
        }
        std::string names;
        for (CpuPath path : runnable) names += std::string(" ") + kernels::cpu_path_name(path);
        std::printf("[kernels] paths compared on this CPU:%s\n", names.c_str());
        return runnable;
    }();
    return p;
}

TEST(PackedMatmul, MatchesADoublePrecisionReferenceWithinTheActivationRounding) {
    ggml_cpu_init();
    // The kernel computes with the weights exactly as stored; its only approximation is the
    // activations' rounding to int8 per 32-block, at most d/2 = max|x|/254 per element. So for
    // every output |y - y_ref| <= sum_b sum_c |w_c| * d_b / 2, plus float rounding of the sums
    // (1e-5 relative to sum |w x|, far above float's 6e-8 per step over ~10 blocks). F16 and BF16
    // weights meet the activations unrounded: only the float term applies.
    const int64_t n_rows = 50, k = 512;  // 4 groups, the last one partial; 16 blocks, 2 k-quant super-blocks
    const int n_tokens = 11;
    for (ggml_type type : kTypes) {
        const Packed p = make_packed(type, n_rows, k, 1);
        const std::vector<float> x = random_activations(n_tokens, k, 2);
        for (CpuPath path : paths()) {
            const std::vector<float> y = run(path, p, x.data(), n_tokens);
            for (int t = 0; t < n_tokens; ++t) {
                for (int64_t r = 0; r < n_rows; ++r) {
                    double ref = 0.0, bound = 0.0, magnitude = 0.0;
                    for (int64_t b = 0; b < k / 32; ++b) {
                        double amax = 0.0, wsum = 0.0;
                        for (int c = 0; c < 32; ++c) {
                            const int64_t col = b * 32 + c;
                            const double w = p.weights[r * k + col], xv = x[t * k + col];
                            ref += w * xv;
                            magnitude += std::fabs(w * xv);
                            amax = std::max(amax, std::fabs(xv));
                            wsum += std::fabs(w);
                        }
                        if (!p.m.is_float()) bound += wsum * amax / 254.0;  // F16/BF16 meet F32 activations as they are
                    }
                    bound = bound * 1.0001 + 1e-5 * magnitude;
                    ASSERT_LE(std::fabs(y[t * n_rows + r] - ref), bound)
                        << ggml_type_name(type) << " " << kernels::cpu_path_name(path) << " row " << r << " token " << t;
                }
            }
        }
    }
}

TEST(PackedMatmul, EveryRowIsBitIdenticalAloneInAnyBatchAndAnyThreadSplit) {
    ggml_cpu_init();
    const int64_t n_rows = 70, k = 256;
    for (ggml_type type : kTypes) {
        const Packed p = make_packed(type, n_rows, k, 3);
        const std::vector<float> x = random_activations(16, k, 4);
        for (CpuPath path : paths()) {
            std::vector<std::vector<float>> alone(16);
            for (int t = 0; t < 16; ++t) alone[t] = run(path, p, x.data() + t * k, 1);
            for (int b = 1; b <= 16; ++b) {
                const int64_t G = p.m.n_groups();
                for (const auto & splits : std::vector<std::vector<std::pair<int64_t, int64_t>>>{
                         {{0, G}}, {{0, G / 2}, {G / 2, G}}, {{0, 1}, {1, 3}, {3, G}}}) {
                    const std::vector<float> y = run(path, p, x.data(), b, splits);
                    for (int t = 0; t < b; ++t) {
                        ASSERT_EQ(0, std::memcmp(y.data() + t * n_rows, alone[t].data(), sizeof(float) * n_rows))
                            << ggml_type_name(type) << " " << kernels::cpu_path_name(path) << " token " << t << " of " << b
                            << ", " << splits.size() << " thread ranges";
                    }
                }
            }
        }
    }
}

TEST(PackedMatmul, EverySimdPathGivesTheGenericPathsBits) {
    if (paths().size() == 1) GTEST_SKIP() << "this CPU runs the generic path only";
    ggml_cpu_init();
    for (ggml_type type : kTypes) {
        const Packed p = make_packed(type, 40, 512, 5);
        const std::vector<float> x = random_activations(13, 512, 6);
        const std::vector<float> ref = run(CpuPath::Generic, p, x.data(), 13);
        for (CpuPath path : paths()) {
            const std::vector<float> y = run(path, p, x.data(), 13);
            EXPECT_EQ(0, std::memcmp(ref.data(), y.data(), sizeof(float) * ref.size())) << ggml_type_name(type) << " " << kernels::cpu_path_name(path);
        }
    }
}

// `size` bytes beside a page that faults on any access: ending where it begins (at_end) or
// beginning where one ends. A body that reads or writes past its buffer's end or before its start
// dies on the spot, sanitized or not.
class GuardedBytes {
public:
    GuardedBytes(size_t size, bool at_end) : page_(static_cast<size_t>(::sysconf(_SC_PAGESIZE))) {
        const size_t span = (size + page_ - 1) / page_ * page_;
        total_ = span + 2 * page_;
        base_ = static_cast<uint8_t *>(::mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        if (base_ == MAP_FAILED) throw std::runtime_error("GuardedBytes: mmap failed");
        if (::mprotect(base_, page_, PROT_NONE) != 0 || ::mprotect(base_ + page_ + span, page_, PROT_NONE) != 0) {
            throw std::runtime_error("GuardedBytes: mprotect failed");  // no guard, no check
        }
        data_ = at_end ? base_ + page_ + span - size : base_ + page_;
    }
    ~GuardedBytes() { ::munmap(base_, total_); }
    GuardedBytes(const GuardedBytes &) = delete;
    GuardedBytes & operator=(const GuardedBytes &) = delete;
    template <class T>
    T * as() const { return reinterpret_cast<T *>(data_); }

private:
    size_t page_, total_ = 0;
    uint8_t * base_ = nullptr;
    uint8_t * data_ = nullptr;
};

// The SIMD bodies run uninstrumented in the sanitized build (src/CMakeLists.txt), so their memory
// accesses are checked here: weights, activations, their quantized blocks and the outputs each
// sit against a faulting page, at the end and then at the start, for every format and token
// count of a tile or a pass. The results must also be the generic path's bits.
TEST(PackedMatmul, EverySimdPathStaysInsideItsBuffers) {
    ggml_cpu_init();
    const int64_t n_rows = 40, k = 512;  // 3 groups, the last one partial
    for (ggml_type type : kTypes) {
        const Packed p = make_packed(type, n_rows, k, 7);
        for (int n_tokens : {1, 2, 3, 4, 5, 8, 16}) {
            const std::vector<float> x = random_activations(n_tokens, k, 8);
            const std::vector<float> ref = run(CpuPath::Generic, p, x.data(), n_tokens);
            const size_t blocks = static_cast<size_t>(n_tokens) * (k / kernels::kBlock);
            for (bool at_end : {true, false}) {
                for (CpuPath path : paths()) {
                    GuardedBytes w(p.bytes.size(), at_end), xs(x.size() * sizeof(float), at_end);
                    GuardedBytes q(x.size(), at_end), d(blocks * sizeof(float), at_end), sums(blocks * sizeof(int32_t), at_end),
                        ds(blocks * sizeof(float), at_end), h32(2 * blocks * sizeof(int32_t), at_end), y(ref.size() * sizeof(float), at_end);
                    std::memcpy(w.as<uint8_t>(), p.bytes.data(), p.bytes.size());
                    std::memcpy(xs.as<float>(), x.data(), x.size() * sizeof(float));
                    kernels::QuantizedActivations a{n_tokens, k, q.as<int8_t>(), d.as<float>(), sums.as<int32_t>(), ds.as<float>(), h32.as<int32_t>()};
                    if (!p.m.is_float()) kernels::quantize_activations_on(path, xs.as<float>(), k, a, kernels::has_min_term(p.m.format));
                    kernels::matmul_on(path, p.m, w.as<uint8_t>(), xs.as<float>(), k, a, y.as<float>(), n_rows, 0, p.m.n_groups());
                    EXPECT_EQ(0, std::memcmp(ref.data(), y.as<float>(), ref.size() * sizeof(float)))
                        << ggml_type_name(type) << " " << kernels::cpu_path_name(path) << " " << n_tokens << " tokens";
                }
            }
        }
    }
}

// Weights stacked into one op (q/k/v, gate/up): each weight's rows carry the bits the weight
// gives alone, across mixed formats (integer and float) and a thread split that cuts a matrix.
TEST(PackedMatmul, StackedWeightsGiveEachWeightsBitsInOneOp) {
    ggml_cpu_init();
    const int64_t k = 512;
    const int n_tokens = 5;
    std::vector<Packed> ps;
    ps.push_back(make_packed(GGML_TYPE_Q4_K, 40, k, 11));
    ps.push_back(make_packed(GGML_TYPE_Q6_K, 24, k, 12));
    ps.push_back(make_packed(GGML_TYPE_F16, 20, k, 13));
    const std::vector<float> x = random_activations(n_tokens, k, 14);

    ggml_init_params params{64 * 1024 * 1024, nullptr, false};
    ggml_context * ctx = ggml_init(params);
    std::vector<ggml_tensor *> ws;
    for (Packed & p : ps) {
        ggml_tensor * w = ggml_new_tensor_2d(ctx, GGML_TYPE_I8, static_cast<int64_t>(p.m.group_bytes()), p.m.n_groups());
        std::memcpy(w->data, p.bytes.data(), p.bytes.size());
        w->extra = &p.m;
        ws.push_back(w);
    }
    ggml_tensor * xt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n_tokens);
    std::memcpy(xt->data, x.data(), sizeof(float) * x.size());
    ggml_tensor * stacked = kernels::packed_matmul(ctx, std::span<ggml_tensor * const>(ws), xt);
    ASSERT_EQ(stacked->ne[0], 40 + 24 + 20);
    for (int threads : {1, 2, 3}) {
        ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, stacked);
        ASSERT_EQ(GGML_STATUS_SUCCESS, ggml_graph_compute_with_ctx(ctx, gf, threads));
        int64_t row0 = 0;
        for (const Packed & p : ps) {
            const std::vector<float> alone = run(kernels::detected_cpu_path(), p, x.data(), n_tokens);
            for (int t = 0; t < n_tokens; ++t) {
                EXPECT_EQ(0, std::memcmp(alone.data() + t * p.m.n_rows, static_cast<const float *>(stacked->data) + t * stacked->ne[0] + row0,
                                         sizeof(float) * p.m.n_rows))
                    << ggml_type_name(p.m.source_type) << " token " << t << " threads " << threads;
            }
            row0 += p.m.n_rows;
        }
    }
    ggml_free(ctx);
}

// The masked attention op's bodies: random F16 K/V, a mask hiding some slots (a whole row hides
// all of them, the last row sees only the last slot), GQA shapes of SmolLM2 (64 x 3 per KV head) and Gemma 3 (256 x 4); every SIMD
// body returns the generic body's bits.
TEST(MaskedAttention, EverySimdPathGivesTheGenericPathsBits) {
    if (paths().size() == 1) GTEST_SKIP() << "this CPU runs the generic path only";
    struct Shape {
        int head_dim, n_head, n_head_kv;
    };
    // 77 slots in one block of 5 rows; 300 slots over several tiles in blocks of 8 and 3 rows; a
    // prefill-sized block of 70 rows (the AVX-512 body finds its rows' visible slots per pair)
    // with 8 query heads per KV head (V summed 2 chunks at a time).
    struct Size {
        int n_rows, n_kv;
    };
    for (const auto & [shape, size] : {std::pair{Shape{64, 9, 3}, Size{5, 77}}, std::pair{Shape{256, 4, 1}, Size{5, 77}},
                                       std::pair{Shape{16, 2, 2}, Size{5, 77}}, std::pair{Shape{64, 9, 3}, Size{11, 300}},
                                       std::pair{Shape{32, 8, 1}, Size{70, 90}}}) {
        const int n_rows = size.n_rows, n_kv = size.n_kv;
        std::mt19937 rng(7);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        const int64_t q_row = int64_t(shape.n_head) * shape.head_dim, kv_row = int64_t(shape.n_head_kv) * shape.head_dim;
        std::vector<float> q(static_cast<size_t>(n_rows * q_row));
        for (float & v : q) v = normal(rng);
        std::vector<uint16_t> k(static_cast<size_t>(n_kv * kv_row)), v(k.size()), mask(static_cast<size_t>(n_rows * n_kv));
        for (auto & h : k) h = ggml_fp32_to_fp16(normal(rng));
        for (auto & h : v) h = ggml_fp32_to_fp16(normal(rng));
        for (int i = 0; i < n_rows; ++i) {
            for (int s = 0; s < n_kv; ++s) {
                const bool hidden = i == 2 || (i == n_rows - 1 ? s != n_kv - 1 : rng() % 3 == 0);
                mask[i * n_kv + s] = ggml_fp32_to_fp16(hidden ? -INFINITY : 0.0f);
            }
        }
        auto run_path = [&](CpuPath path) {
            kernels::AttentionArgs a;
            a.q = q.data(), a.q_row = q_row, a.k = k.data(), a.v = v.data(), a.kv_row = kv_row;
            a.mask = mask.data(), a.mask_row = n_kv, a.n_kv = n_kv, a.n_rows = n_rows;
            a.head_dim = shape.head_dim, a.n_head = shape.n_head, a.n_head_kv = shape.n_head_kv;
            a.scale = 0.125f;
            std::vector<float> out(static_cast<size_t>(n_rows * q_row), NAN);
            a.out = out.data(), a.out_row = q_row;
            const int64_t pairs = int64_t(n_rows) * shape.n_head_kv;
            kernels::attend_on(path, a, 0, pairs / 2);  // two threads' halves, as the op splits them
            kernels::attend_on(path, a, pairs / 2, pairs);
            return out;
        };
        const std::vector<float> ref = run_path(CpuPath::Generic);
        for (size_t e = 0; e < ref.size(); ++e) ASSERT_TRUE(std::isfinite(ref[e])) << e;
        for (CpuPath path : paths()) {
            const std::vector<float> out = run_path(path);
            EXPECT_EQ(0, std::memcmp(ref.data(), out.data(), sizeof(float) * ref.size()))
                << kernels::cpu_path_name(path) << " head " << shape.head_dim << " x " << shape.n_head / shape.n_head_kv;
        }
    }
}

// The whole forward with specula's kernels: each row's logits, computed in a chain or tree block
// of 1..16 rows with 1 or 2 threads, equal to the bit those of a one-token forward of the same
// row after the same accepted prefix.
class ForwardBatchInvariance : public ::testing::TestWithParam<std::string> {};

std::vector<float> row_logits(const ForwardOutput & o, int i) {
    auto r = o.logits_row(i);
    return {r.begin(), r.end()};
}

// Every matrix of a fixture goes through specula's kernels (else the check below would pass
// vacuously on ggml's for that matrix... and fail, but for the wrong reason).
void expect_all_matrices_packable(const std::string & path) {
    gguf_init_params params{true, nullptr};
    gguf_context * g = gguf_init_from_file(path.c_str(), params);
    ASSERT_NE(g, nullptr) << path;
    ggml_context * meta = nullptr;
    gguf_free(g);
    params.ctx = &meta;
    g = gguf_init_from_file(path.c_str(), params);
    for (ggml_tensor * t = ggml_get_first_tensor(meta); t; t = ggml_get_next_tensor(meta, t)) {
        if (ggml_n_dims(t) != 2) continue;
        kernels::PackedFormat f;
        EXPECT_TRUE(kernels::packable(t->type, t->ne[0], &f)) << ggml_get_name(t) << " " << ggml_type_name(t->type);
    }
    ggml_free(meta);
    gguf_free(g);
}

TEST_P(ForwardBatchInvariance, EveryRowEqualsItsOneTokenForward) {
    const std::string path = test::model_path(GetParam());
    expect_all_matrices_packable(path);
    Backend one(BackendOptions{"cpu", 1, Attention::Auto, Kernels::Specula});
    Backend two(BackendOptions{"cpu", 2, Attention::Auto, Kernels::Specula});
    ASSERT_TRUE(one.own_kernels());
    ASSERT_EQ(one.attention_kernel(), AttentionKernel::Specula);
    auto model1 = Model::load(path, one);
    auto model2 = Model::load(path, two);
    ModelRunner runner1(*model1), runner2(*model2);
    const std::vector<int32_t> prefix = {1, 450, 4996, 17354, 1701, 338};
    const std::vector<int32_t> block = {310, 526, 2253, 825, 29889, 3186, 263, 1243, 363, 278, 937, 2582, 29892, 322, 591, 1073};
    const int base = static_cast<int>(prefix.size());

    // Reference: the chain decoded one token at a time.
    std::vector<std::vector<float>> chain_ref;
    {
        KvCache cache(one, model1->config(), 64);
        runner1.forward(ForwardBatch::causal(prefix, 0, {}), cache);
        for (int i = 0; i < 16; ++i) chain_ref.push_back(row_logits(runner1.forward(ForwardBatch::causal(std::span(block).subspan(i, 1), base + i, {0}), cache), 0));
    }
    for (int n = 1; n <= 16; ++n) {
        for (ModelRunner * runner : {&runner1, &runner2}) {
            const Backend & backend = runner == &runner1 ? one : two;
            KvCache cache(const_cast<Backend &>(backend), model1->config(), 64);
            runner->forward(ForwardBatch::causal(prefix, 0, {}), cache);
            std::vector<int32_t> rows(n);
            for (int i = 0; i < n; ++i) rows[i] = i;
            ForwardOutput out = runner->forward(ForwardBatch::causal(std::span(block).first(n), base, rows), cache);
            for (int i = 0; i < n; ++i) {
                ASSERT_EQ(row_logits(out, i), chain_ref[i]) << "chain row " << i << " of " << n << ", " << backend.n_threads() << " threads";
            }
        }
    }

    // A tree: row i's parent is (i - 1) / 2 (a binary tree over the block's tokens). Reference:
    // each row's root-to-node path decoded one token at a time.
    for (int n : {3, 5, 7, 9, 13, 16}) {
        std::vector<int> parents(n), depth(n);
        for (int i = 0; i < n; ++i) {
            parents[i] = i == 0 ? -1 : (i - 1) / 2;
            depth[i] = i == 0 ? 0 : depth[parents[i]] + 1;
        }
        ForwardBatch tree;
        tree.tokens.assign(block.begin(), block.begin() + n);
        for (int i = 0; i < n; ++i) tree.positions.push_back(base + depth[i]), tree.logit_rows.push_back(i);
        tree.mask = BlockMask::from_parents(parents);
        for (ModelRunner * runner : {&runner1, &runner2}) {
            Backend & backend = runner == &runner1 ? one : two;
            KvCache cache(backend, model1->config(), 64);
            runner->forward(ForwardBatch::causal(prefix, 0, {}), cache);
            ForwardOutput out = runner->forward(tree, cache);
            for (int i = 0; i < n; ++i) {
                std::vector<int> tree_path;
                for (int j = i; j >= 0; j = parents[j]) tree_path.insert(tree_path.begin(), j);
                KvCache ref_cache(one, model1->config(), 64);
                runner1.forward(ForwardBatch::causal(prefix, 0, {}), ref_cache);
                std::vector<float> ref;
                for (size_t d = 0; d < tree_path.size(); ++d) {
                    const int32_t token = block[tree_path[d]];
                    ref = row_logits(runner1.forward(ForwardBatch::causal(std::span(&token, 1), base + static_cast<int>(d), {0}), ref_cache), 0);
                }
                ASSERT_EQ(row_logits(out, i), ref) << "tree row " << i << " of " << n << ", " << backend.n_threads() << " threads";
            }
        }
    }
}

// The control: ggml's kernels are not batch-invariant (here F32 weights: ggml runs one row through
// its dot product and 8 rows through tinyBLAS), which is why specula has its own; the same
// comparison as above sees the difference.
TEST(ForwardBatchInvariance, GgmlsKernelsAreNotAndTheCheckSeesIt) {
    Backend backend(BackendOptions{"cpu", 1, Attention::Auto, Kernels::Ggml});
    auto model = Model::load(test::model_path("llama_gqa_f32"), backend);
    ModelRunner runner(*model);
    const std::vector<int32_t> prefix = {1, 450, 4996, 17354, 1701, 338};
    const std::vector<int32_t> block = {310, 526, 2253, 825, 29889, 3186, 263, 1243};
    const int base = static_cast<int>(prefix.size());
    KvCache one(backend, model->config(), 64), batch(backend, model->config(), 64);
    runner.forward(ForwardBatch::causal(prefix, 0, {}), one);
    runner.forward(ForwardBatch::causal(prefix, 0, {}), batch);
    ForwardOutput all = runner.forward(ForwardBatch::causal(block, base, {0, 1, 2, 3, 4, 5, 6, 7}), batch);
    int differing = 0;
    for (int i = 0; i < 8; ++i) {
        ForwardOutput o = runner.forward(ForwardBatch::causal(std::span(block).subspan(i, 1), base + i, {0}), one);
        differing += row_logits(o, 0) != row_logits(all, i);
    }
    EXPECT_GT(differing, 0);
}

INSTANTIATE_TEST_SUITE_P(PackedTypes, ForwardBatchInvariance,
                         ::testing::Values("llama_q8_0", "llama_q4_0", "llama_q4_1_tied", "llama_q5_0", "llama_q4_k",
                                           "llama_q6_k", "llama_tied_f16", "llama_bf16"));

}  // namespace
}  // namespace specula
