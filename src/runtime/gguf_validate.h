#pragma once
// Checks between GGUF parsing and use. ggml's parser guarantees a well-formed file; a well-formed
// file can still be hostile (edited by hand, written by a converter with a bug, cut short), and
// every value specula sizes something by or indexes with passes through here first: metadata is
// range-checked and checked for consistency, each tensor's type and shape against what the graph
// does with it, all before anything is allocated. Tensor data extents are checked when the file
// is opened (GgufFile). Each failure is one Error naming the file, the key or tensor, the value
// and what was expected (docs/validation.md).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/model_config.h"

struct ggml_tensor;

namespace specula {

class GgufFile;

// Bound on every width, head size, head count and layer count read from metadata, and on the
// attention widths derived from them (heads x head size): far above any real model (widths reach
// 53248, heads 128), low enough that such a width fits an int, as the runtime holds it, and that
// element counts of tensors shaped by two of them fit int64.
inline constexpr int kMaxModelDim = 1 << 20;

// Integer metadata `key` within [lo, hi]; throws Error "<file>: metadata key K is V, expected lo..hi".
int get_int_in(const GgufFile & f, const std::string & key, int lo, int hi);
std::optional<int> find_int_in(const GgufFile & f, const std::string & key, int lo, int hi);
// Float metadata `key`, finite and within (lo, hi].
float get_float_in(const GgufFile & f, const std::string & key, float lo, float hi);
std::optional<float> find_float_in(const GgufFile & f, const std::string & key, float lo, float hi);

// The attention and feed-forward sizes of a llama-family layer, from keys under `prefix`
// ("llama.", "eagle3.", ...), range-checked and consistent: kv heads divide heads, the heads
// divide the width when no key_length is stored, rotary dims and value length equal the head size
// (partial rotary is not supported), the head size is even (rope rotates pairs).
void read_layer_sizes(const GgufFile & f, const std::string & prefix, ModelConfig & c);

// The file's blk.N tensors must cover exactly layers 0..n_layer-1: a block_count larger than the
// tensors present is caught before anything is sized by it.
void check_block_count(const GgufFile & f, const std::string & key, int n_layer);

// The vocabulary's token texts (tokenizer.ggml.tokens, when stored as strings) are distinct, as
// libllama's vocabulary loader asserts (an abort, not an error) after reading them; it reads an
// empty text as "[EMPTY_<id>]", which may then repeat another. A SentencePiece vocabulary has the
// 256 byte tokens <0x00>..<0xFF>: libllama's tokenizer looks them up by text for text it has no
// token for, and throws std::out_of_range out of tokenizing when one is missing. Checked before any
// Tokenizer loads the file.
void check_token_texts(const GgufFile & f);

// Rows of token_embd.weight (the vocabulary size), checked against `vocab_key` when stored.
int embedding_rows(const GgufFile & f, const std::string & vocab_key);

// A weight the graph uses: 1-D weights (norms, biases, rope factors) are multiplied or added
// elementwise to F32 activations and must be F32; 2-D weights are matrix-multiplied or read by
// row and must be a type ggml's mul_mat and get_rows take. The shape must be exactly `shape`.
void check_weight(const GgufFile & f, const std::string & name, const ggml_tensor & meta, std::span<const int64_t> shape);

// An EAGLE-3 head's d2t (draft id -> target id): a 1-D I64 tensor of 1..n_target_vocab distinct
// ids, each a target token.
std::vector<int32_t> read_d2t(const GgufFile & f, int n_target_vocab);
// An EAGLE-3 head's t2d, when stored (specula does not use it, a file that has one must still be
// coherent): a 1-D integer tensor of n_target_vocab flags, set exactly for the tokens d2t maps to
// (or for every token when d2t is empty).
void check_t2d(const GgufFile & f, int n_target_vocab, std::span<const int32_t> d2t);

}  // namespace specula
