#pragma once
// A bench twin: a bigger llama model (e.g. the Llama-3.2-1B shape) computing the same function as
// a small trained target, up to rounding. The target's heads, FFN units and layers are embedded in
// the larger shape; every added head, unit and layer has a zero output projection, and norm
// weights are rescaled for the zero-padded width (RMSNorm then matches, save for epsilon).
// Benchmarks get the target's real acceptance at a real 1B model's memory and compute cost.
#include <string>

namespace specula {

void write_bench_twin(const std::string & target_path, const std::string & shape, const std::string & weight_type,
                      const std::string & out_path);  // throws Error

// The EAGLE-3 head of `target`, rewritten for its bench twin: fc reads the twin's wider features
// (zero weights on the padding) and the head gets its own copy of the target's token embeddings.
void write_bench_twin_eagle3(const std::string & head_path, const std::string & target_path, const std::string & shape,
                             const std::string & out_path);  // throws Error

}  // namespace specula
