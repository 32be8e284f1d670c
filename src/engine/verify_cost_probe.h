#pragma once
// The verify-cost probe: target forwards of 1..n rows timed at the cache's depth, and how much a
// row costs more deeper in a context. It measures the curve the policies price drafts with
// (policy/verify_cost.h, ModelBundle::measure_verify_cost_once); the forwards it times run
// through the target's runner, so it lives beside the engine, not in policy/.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace specula {

class KvCache;
class ModelRunner;

// Milliseconds of a target forward of the first `rows` tokens at the cache's current depth, all
// rows with logits and the residual stream entering each of `tap_layers` (a drafter's features,
// as a generation asks for them: the graphs built here then serve its verify blocks; median of
// `reps` after an untimed run); the cache is left as it was.
double time_forward(ModelRunner & target, KvCache & cache, std::span<const int32_t> tokens, int rows, int reps,
                    std::span<const int> tap_layers = {});

// Measured cost (ms, median of `reps`) of a target forward of b = 1..max_tokens tokens at the
// cache's current depth (time_forward's, with its taps); the cache is left as it was. Feeds the cost policy.
std::vector<double> measure_verify_cost(ModelRunner & target, KvCache & cache, std::span<const int32_t> tokens, int max_tokens, int reps = 3,
                                        std::span<const int> tap_layers = {});

// How much more a verify row past the first costs per token of context: `rows` rows and one
// timed `deeper` tokens past the cache's depth (tokens: those, then the rows), against `curve`
// timed at that depth; the cache is left as it was. Every row attends over the whole context, so
// deep in a long one an extra row costs far more than the curve says; rounds alone cannot show
// it when they all verify the same rows (VerifyCost takes this as its prior).
double measure_row_depth_ms(ModelRunner & target, KvCache & cache, std::span<const int32_t> tokens, std::span<const double> curve, int rows,
                            int deeper, int reps = 3);
// How much deeper than its curve an engine times that growth (with room in the cache for it).
inline constexpr int kDepthProbeTokens = 512;

// The timed sizes of such a curve (ascending; ms[b - 1] each one's time) that were stalled, timed
// again with time_size: a size costing more than kStalledAbove times a larger one (the process
// descheduled, a page-fault storm, a neighbour's burst over a size's few repetitions), as fewer
// tokens never cost more. Up to three passes; one stall left in the curve would bend every policy
// decision of the run (a 4-token forward timed above 5 and 8 tokens makes every tree of 4 or more
// nodes look dear).
inline constexpr double kStalledAbove = 1.1;
void retime_stalled_sizes(std::span<const int> timed, std::vector<double> & ms, const std::function<double(int)> & time_size);

}  // namespace specula
