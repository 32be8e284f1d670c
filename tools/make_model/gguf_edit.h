#pragma once
// Helpers for tools that rewrite GGUF files (bench twins, compact EAGLE-3 vocabularies).
#include <string>
#include <vector>

struct gguf_context;

namespace specula {

class GgufFile;

// A tensor of `f` as floats, whatever its stored type; throws Error if absent or unreadable.
std::vector<float> read_f32(const GgufFile & f, const std::string & name);

// A new GGUF context holding every metadata key of `path` (no tensors).
gguf_context * metadata_of(const std::string & path);

}  // namespace specula
