#pragma once
// Pieces of the distribution tests: the chi-square critical value they compare against and the
// broken verifier their controls run.
#include <cmath>
#include <utility>
#include <vector>

#include "engine/sequence.h"
#include "sample/sampler.h"
#include "tree/token_tree.h"
#include "verify/verify.h"

namespace specula::test {

// Chi-square critical value at p = 1e-4 (Wilson-Hilferty).
inline double chi2_critical(int dof) {
    const double z = 3.719, a = 2.0 / (9.0 * dof);
    return dof * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// One cell of a chi-square test: its exact probability and how often it was observed.
struct Cell {
    double prob;
    double count;
};

// Chi-square statistic and degrees of freedom of `runs` observations against the cells' exact
// probabilities; cells expected fewer than 5 times are pooled into one.
inline std::pair<double, int> chi_square(const std::vector<Cell> & cells, int runs) {
    double stat = 0.0, pooled_e = 0.0, pooled_o = 0.0;
    int n = 0;
    for (const Cell & c : cells) {
        const double e = c.prob * runs;
        if (e < 5.0) {
            pooled_e += e, pooled_o += c.count;
            continue;
        }
        stat += (c.count - e) * (c.count - e) / e;
        ++n;
    }
    if (pooled_e > 0.0) {
        stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
        ++n;
    }
    return {stat, n - 1};
}

// Accepts every drafted token (first children), then samples the bonus from the target: a
// verifier with a bug.
inline VerifyResult accept_everything(const TokenTree & tree, const TargetLogits & logits, const SamplingParams & sp, Rng & rng) {
    VerifyResult r;
    int cur = TokenTree::kRoot;
    for (int c = tree.first_child_of(cur); c >= 0; c = tree.first_child_of(c)) r.accepted.push_back(cur = c);
    std::vector<float> p;
    processed_probs(logits.row_of(cur), sp, p);
    r.next_token = sample_from(p, rng);
    r.bonus = true;
    return r;
}

}  // namespace specula::test
