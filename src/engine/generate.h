#pragma once
// Plain autoregressive decoding with specula's runtime: the baseline every speculative mode must
// reproduce token for token at temperature 0.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "specula/specula.h"

namespace specula {

class KvCache;
class ModelRunner;

// Feeds the prompt in chunks into an empty `cache`, returns the logits of its last token.
std::vector<float> prefill(ModelRunner & runner, KvCache & cache, std::span<const int32_t> prompt, int chunk = 512);

// Decodes up to options.n_predict tokens after `prompt` (cache must be empty).
// is_end(token) ends generation when options.stop_at_end_of_generation is set.
GenerationStats generate_plain(ModelRunner & runner, KvCache & cache, std::span<const int32_t> prompt,
                               const GenerationOptions & options, const std::function<bool(int32_t)> & is_end,
                               const TokenSink & sink);

}  // namespace specula
