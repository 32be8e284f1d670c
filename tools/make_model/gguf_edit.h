#pragma once
// Helpers for tools that write GGUF files (test models, bench twins, compact EAGLE-3 vocabularies, converted heads).
#include <string>
#include <vector>

struct gguf_context;
struct ggml_context;

namespace specula {

class GgufFile;

// A tensor of `f` as floats, whatever its stored type; throws Error if absent or unreadable.
std::vector<float> read_f32(const GgufFile & f, const std::string & name);

// A new GGUF context holding every metadata key of `path` (no tensors).
gguf_context * metadata_of(const std::string & path);

// Writes `out` (whose tensors' data live in `ctx`) to `path` and frees both; throws Error if the write failed.
void write_gguf(gguf_context * out, ggml_context * ctx, const std::string & path);

}  // namespace specula
