#include "sample/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <string>

#include "common/fast_exp.h"

// The vocabulary-wide loops (a softmax over 49152 or 262144 logits) run once per sampled token
// and per drafted or verified node at T > 0, single-threaded between target forwards: their bodies
// are built for AVX-512 and AVX2 beside the portable one, and the best the CPU runs is picked once.
// The file is compiled without FMA contraction and without trapping math (src/CMakeLists.txt):
// every path computes the same bits (test_sampler compares them), and the exponential loops
// vectorise at all.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SPECULA_SAMPLER_X86 1
#endif

namespace specula {

namespace {

// Sixteen independent partial sums: vectorisable without letting the compiler reassociate.
[[gnu::always_inline]] inline double sum(std::span<const float> v) {
    float acc[16] = {};
    size_t i = 0;
    for (; i + 16 <= v.size(); i += 16) {
        for (size_t j = 0; j < 16; ++j) acc[j] += v[i + j];
    }
    double s = 0.0;
    for (float a : acc) s += a;
    for (; i < v.size(); ++i) s += v[i];
    return s;
}

// Sixteen lane maxima, then theirs: a maximum is exact in any order, and lanes vectorise where
// std::max_element's index bookkeeping kept the loop scalar. A NaN never wins a comparison, so
// NaN logits (a model whose weights or activations overflowed) count as -inf: lanes start there,
// not at v[0], which may be NaN.
[[gnu::always_inline]] inline float max_value_body(std::span<const float> v) {
    float lane[16];
    for (float & l : lane) l = -INFINITY;
    size_t i = 0;
    for (; i + 16 <= v.size(); i += 16) {
        for (size_t j = 0; j < 16; ++j) lane[j] = v[i + j] > lane[j] ? v[i + j] : lane[j];
    }
    float m = lane[0];
    for (float l : lane) m = l > m ? l : m;
    for (; i < v.size(); ++i) m = v[i] > m ? v[i] : m;
    return m;
}

[[gnu::always_inline]] inline SoftmaxStats softmax_stats_body(std::span<const float> logits, std::vector<float> & scratch) {
    SoftmaxStats st;
    const size_t n = logits.size();
    st.max_logit = max_value_body(logits);
    scratch.resize(2 * n);
    float * e = scratch.data();
    float * ed = scratch.data() + n;
    for (size_t i = 0; i < n; ++i) {
        const float d = logits[i] - st.max_logit;
        e[i] = exp_nonpositive(d);
        ed[i] = e[i] * std::max(-87.0f, d);  // this order gives -87 for a NaN d, whose e[i] is 0
    }
    const double z = sum({e, n});
    st.log_z = static_cast<float>(std::log(z));
    st.entropy = static_cast<float>(std::log(z) - sum({ed, n}) / z);
    return st;
}

[[gnu::always_inline]] inline int32_t argmax_body(std::span<const float> logits) {
    const float m = max_value_body(logits);
    for (size_t i = 0; i < logits.size(); ++i) {
        if (logits[i] == m) return static_cast<int32_t>(i);  // the first maximum, as std::max_element
    }
    return 0;  // only for an empty row or one without a number above -inf
}

// Ranks candidates: descending logit, ties by id, NaN as -inf. Comparing NaN directly would break
// the strict weak order std::sort and std::partial_sort require (undefined behaviour).
[[gnu::always_inline]] inline float rank_key(float logit) { return std::isnan(logit) ? -INFINITY : logit; }
[[gnu::always_inline]] inline bool ranks_before(std::span<const float> logits, int32_t a, int32_t b) {
    const float la = rank_key(logits[a]), lb = rank_key(logits[b]);
    return la > lb || (la == lb && a < b);
}

[[gnu::always_inline]] inline void processed_probs_body(std::span<const float> logits, const SamplingParams & p, std::vector<float> & probs) {
    const size_t n = logits.size();
    if (p.top_k <= 0 && p.top_p >= 1.0f && p.min_p <= 0.0f && !p.greedy()) {  // plain temperature: no sort needed
        probs.resize(n);
        const float inv_t = 1.0f / p.temperature;
        const float max_logit = max_value_body(logits);
        for (size_t i = 0; i < n; ++i) probs[i] = exp_nonpositive((logits[i] - max_logit) * inv_t);
        const double total = sum(probs);
        const float inv = total > 0.0 ? static_cast<float>(1.0 / total) : 0.0f;  // 0: no logit above -inf, nothing to draw
        for (float & x : probs) x *= inv;
        return;
    }
    probs.assign(n, 0.0f);
    if (p.greedy()) {
        probs[argmax_body(logits)] = 1.0f;
        return;
    }
    // Candidates sorted by logit, descending (ties by id, so results are deterministic).
    std::vector<int32_t> ids(n);
    std::iota(ids.begin(), ids.end(), 0);
    size_t keep = n;
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
        keep = static_cast<size_t>(p.top_k);
        std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), [&](int32_t a, int32_t b) { return ranks_before(logits, a, b); });
    } else {
        std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return ranks_before(logits, a, b); });
    }
    ids.resize(keep);
    while (!ids.empty() && std::isnan(logits[ids.back()])) ids.pop_back();  // ranked last, drawn never
    if (ids.empty()) return;

    if (p.top_p < 1.0f || p.min_p > 0.0f) {
        const float max_logit = logits[ids[0]];
        std::vector<double> w(keep);
        double sum = 0.0;
        for (size_t i = 0; i < keep; ++i) sum += (w[i] = std::exp(static_cast<double>(logits[ids[i]]) - max_logit));
        size_t cut = keep;
        if (p.min_p > 0.0f) {
            // w[0] is the max probability (times sum); keep tokens with prob >= min_p * max.
            cut = 1;
            while (cut < keep && w[cut] >= p.min_p * w[0]) ++cut;
        }
        if (p.top_p < 1.0f) {
            double cum = 0.0;
            for (size_t i = 0; i < cut; ++i) {
                cum += w[i] / sum;
                if (cum >= p.top_p) {
                    cut = i + 1;
                    break;
                }
            }
        }
        ids.resize(std::max<size_t>(cut, 1));
    }

    const double inv_t = 1.0 / p.temperature;
    const double max_scaled = logits[ids[0]] * inv_t;
    double sum = 0.0;
    for (int32_t id : ids) sum += (probs[id] = static_cast<float>(std::exp(logits[id] * inv_t - max_scaled)));
    for (int32_t id : ids) probs[id] = static_cast<float>(probs[id] / sum);
}

// Each path: the bodies compiled for one instruction set.
#define SPECULA_SAMPLER_PATH(suffix, attribute)                                                                           \
    attribute float max_value_##suffix(std::span<const float> v) { return max_value_body(v); }                            \
    attribute int32_t argmax_##suffix(std::span<const float> v) { return argmax_body(v); }                                \
    attribute SoftmaxStats softmax_stats_##suffix(std::span<const float> v, std::vector<float> & s) {                     \
        return softmax_stats_body(v, s);                                                                                  \
    }                                                                                                                     \
    attribute void processed_probs_##suffix(std::span<const float> v, const SamplingParams & p, std::vector<float> & o) { \
        processed_probs_body(v, p, o);                                                                                    \
    }                                                                                                                     \
    constexpr VocabularyLoops k_##suffix##_loops{max_value_##suffix, argmax_##suffix, softmax_stats_##suffix, processed_probs_##suffix};

struct VocabularyLoops {
    float (*max_value)(std::span<const float>);
    int32_t (*argmax)(std::span<const float>);
    SoftmaxStats (*softmax_stats)(std::span<const float>, std::vector<float> &);
    void (*processed_probs)(std::span<const float>, const SamplingParams &, std::vector<float> &);
};

SPECULA_SAMPLER_PATH(portable, )
#ifdef SPECULA_SAMPLER_X86
SPECULA_SAMPLER_PATH(avx2, __attribute__((target("avx2"))))
SPECULA_SAMPLER_PATH(avx512, __attribute__((target("avx512f"))))
#endif

const VocabularyLoops & loops_of(SamplerPath path) {
    switch (path) {
#ifdef SPECULA_SAMPLER_X86
        case SamplerPath::Avx2: return k_avx2_loops;
        case SamplerPath::Avx512: return k_avx512_loops;
#endif
        default: return k_portable_loops;
    }
}

const VocabularyLoops & best_loops() {
    static const VocabularyLoops & loops = loops_of(sampler_paths().back());
    return loops;
}

}  // namespace

std::vector<SamplerPath> sampler_paths() {
    std::vector<SamplerPath> paths = {SamplerPath::Portable};
#ifdef SPECULA_SAMPLER_X86
    if (__builtin_cpu_supports("avx2")) paths.push_back(SamplerPath::Avx2);
    if (__builtin_cpu_supports("avx512f")) paths.push_back(SamplerPath::Avx512);
#endif
    return paths;
}

const char * sampler_path_name(SamplerPath path) {
    switch (path) {
        case SamplerPath::Avx2: return "avx2";
        case SamplerPath::Avx512: return "avx512f";
        default: return "portable";
    }
}

float max_value(std::span<const float> values) { return best_loops().max_value(values); }
int32_t argmax(std::span<const float> logits) { return best_loops().argmax(logits); }
SoftmaxStats softmax_stats(std::span<const float> logits, std::vector<float> & scratch) { return best_loops().softmax_stats(logits, scratch); }
void processed_probs(std::span<const float> logits, const SamplingParams & params, std::vector<float> & probs) {
    best_loops().processed_probs(logits, params, probs);
    if (params.infill && !params.greedy()) apply_infill(*params.infill, probs);
}

void apply_infill(const InfillVocabulary & v, std::vector<float> & probs) {
    // A compact draft vocabulary's row: drafts are proposals, verified against the target's
    // transformed distribution all the same.
    if (probs.size() != v.pieces.size()) return;
    std::vector<int32_t> ids;
    for (size_t i = 0; i < probs.size(); ++i) {
        if (probs[i] > 0.0f) ids.push_back(static_cast<int32_t>(i));
    }
    // Most likely first, as llama.cpp's candidates after top-k (ties by id).
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); });
    const size_t n = ids.size();
    std::vector<double> p(n);
    double p_txt = 0.0, p_eog = 0.0;
    for (size_t i = 0; i < n; ++i) {
        p[i] = probs[ids[i]];
        (v.end_of_generation[ids[i]] ? p_eog : p_txt) += p[i];
    }
    for (int32_t id : ids) probs[id] = 0.0f;
    std::vector<char> keep(n, 0);
    if (3.0 * p_eog * static_cast<double>(n) > p_txt) {
        for (size_t i = 0; i < n; ++i) keep[i] = v.end_of_generation[ids[i]];
    } else {
        std::vector<char> merged(n, 0);
        for (size_t i0 = 0; i0 < n; ++i0) {
            const std::string & a = v.pieces[ids[i0]];
            for (size_t i1 = 0; i1 < n && !merged[i0]; ++i1) {
                if (i0 == i1 || merged[i1]) continue;
                const std::string & b = v.pieces[ids[i1]];
                if (a.empty() || a.size() > b.size() || b.compare(0, a.size(), a) != 0) continue;
                const bool into_i1 = p[i1] > p[i0];
                const size_t dst = into_i1 ? i1 : i0, src = into_i1 ? i0 : i1;
                p[dst] += p[src];
                p[src] = 0.0;
                merged[src] = 1;
            }
        }
        bool text = false;
        for (size_t i = 0; i < n; ++i) {
            keep[i] = v.end_of_generation[ids[i]] || p[i] >= 0.2;
            text = text || (keep[i] && !v.end_of_generation[ids[i]]);
        }
        if (!text) {
            probs[v.end_token] = 1.0f;
            return;
        }
    }
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += keep[i] ? p[i] : 0.0;
    for (size_t i = 0; i < n; ++i) {
        if (keep[i]) probs[ids[i]] = static_cast<float>(p[i] / total);
    }
}

SoftmaxStats softmax_stats_on(SamplerPath path, std::span<const float> logits, std::vector<float> & scratch) {
    return loops_of(path).softmax_stats(logits, scratch);
}
int32_t argmax_on(SamplerPath path, std::span<const float> logits) { return loops_of(path).argmax(logits); }
void processed_probs_on(SamplerPath path, std::span<const float> logits, const SamplingParams & params, std::vector<float> & probs) {
    loops_of(path).processed_probs(logits, params, probs);
    if (params.infill && !params.greedy()) apply_infill(*params.infill, probs);
}

std::vector<int32_t> top_k_ids(std::span<const float> scores, int k) {
    k = std::min<int>(k, static_cast<int>(scores.size()));
    if (k <= 0) return {};  // the scan below compares against its k-th best, which k = 0 lacks
    if (k <= 16) {
        // One pass keeping the best k in order; scanning ids upwards and admitting only strictly
        // better scores breaks ties by id.
        std::vector<int32_t> best;
        best.reserve(k + 1);
        for (size_t i = 0; i < scores.size(); ++i) {
            const float score = rank_key(scores[i]);
            if (static_cast<int>(best.size()) == k && !(score > rank_key(scores[best.back()]))) continue;
            auto pos = best.end();
            while (pos != best.begin() && score > rank_key(scores[*(pos - 1)])) --pos;
            best.insert(pos, static_cast<int32_t>(i));
            if (static_cast<int>(best.size()) > k) best.pop_back();
        }
        return best;
    }
    std::vector<int32_t> ids(scores.size());
    std::iota(ids.begin(), ids.end(), 0);
    k = std::min<int>(k, static_cast<int>(ids.size()));
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) { return ranks_before(scores, a, b); });
    ids.resize(k);
    return ids;
}

namespace {

bool skipped(std::span<const int32_t> skip, size_t i) { return std::find(skip.begin(), skip.end(), static_cast<int32_t>(i)) != skip.end(); }

constexpr size_t kDrawChunk = 256;

// The sum of probs[begin, begin + len) without the entries in `skip`, in double: in eight
// vectorisable lanes where none falls in it, entry by entry where one does (a difference would lose
// the small entries beside a large skipped one). In double, the draws are those of one running
// sum in index order unless the uniform falls within about 1e-15 of the total of a boundary.
double chunk_sum(std::span<const float> probs, size_t begin, size_t len, std::span<const int32_t> skip) {
    bool any = false;
    for (int32_t s : skip) any = any || (static_cast<size_t>(s) >= begin && static_cast<size_t>(s) < begin + len);
    if (!any) {
        double lane[8] = {};
        size_t j = begin;
        for (; j + 8 <= begin + len; j += 8) {
            for (size_t l = 0; l < 8; ++l) lane[l] += probs[j + l];
        }
        double total = 0.0;
        for (double l : lane) total += l;
        for (; j < begin + len; ++j) total += probs[j];
        return total;
    }
    double total = 0.0;
    for (size_t j = begin; j < begin + len; ++j) total += skipped(skip, j) ? 0.0 : probs[j];
    return total;
}

// One draw from `probs` (entries >= 0) without the entries in `skip`, u uniform in [0, 1): the
// first entry at which the running sum passes u x their total. The running sum goes a chunk at a
// time, and only the chunk where it passes is walked entry by entry; should rounding leave that
// walk short, it goes on into the next chunk, and past the end the last drawable entry absorbs it.
// -1 if no entry is drawable.
int32_t draw_index(std::span<const float> probs, double u, std::span<const int32_t> skip) {
    const size_t n = probs.size();
    std::vector<double> chunks((n + kDrawChunk - 1) / kDrawChunk);
    double total = 0.0;
    for (size_t c = 0; c < chunks.size(); ++c) total += chunks[c] = chunk_sum(probs, c * kDrawChunk, std::min(kDrawChunk, n - c * kDrawChunk), skip);
    const double r = u * total;
    double acc = 0.0;
    for (size_t c = 0; c < chunks.size(); ++c) {
        if (acc + chunks[c] <= r) {
            acc += chunks[c];
            continue;
        }
        for (size_t j = c * kDrawChunk; j < std::min(n, (c + 1) * kDrawChunk); ++j) {
            if (!(probs[j] > 0.0f) || skipped(skip, j)) continue;
            acc += probs[j];
            if (r < acc) return static_cast<int32_t>(j);
        }
    }
    for (size_t j = n; j-- > 0;) {
        if (probs[j] > 0.0f && !skipped(skip, j)) return static_cast<int32_t>(j);
    }
    return -1;
}

}  // namespace

double probability_sum(std::span<const float> probs) { return sum(probs); }

double subtract_clamped(std::span<float> p, std::span<const float> q) {
    const size_t n = std::min(p.size(), q.size());
    for (size_t i = 0; i < n; ++i) p[i] = p[i] > q[i] ? p[i] - q[i] : 0.0f;
    return sum(p);
}

std::vector<int32_t> sample_without_replacement(std::span<const float> probs, int k, Rng & rng) {
    // k successive draws, each from what the earlier ones left: one uniform per draw.
    std::vector<int32_t> drawn;
    for (int j = 0; j < k; ++j) {
        const int32_t pick = draw_index(probs, rng.uniform(), drawn);
        if (pick < 0) break;  // support exhausted
        drawn.push_back(pick);
    }
    return drawn;
}

int32_t sample_from(std::span<const float> probs, Rng & rng) { return sample_at(probs, rng.uniform()); }

int32_t sample_at(std::span<const float> probs, double u) {
    const int32_t pick = draw_index(probs, u, {});
    return pick < 0 ? 0 : pick;
}

namespace {
uint64_t splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
}  // namespace

// Two rounds of splitmix64: the seed's hash mixed with the position, hashed again, so that
// neighbouring seeds (choice i of a request is seeded seed + i) and positions share no draws.
double Rng::at(int64_t position) const {
    const uint64_t z = splitmix64(splitmix64(seed_) ^ static_cast<uint64_t>(position));
    return static_cast<double>(z >> 11) * 0x1.0p-53;
}

}  // namespace specula
