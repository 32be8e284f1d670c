#pragma once
// Converts public EAGLE checkpoints (HF directory: config.json + *.safetensors) to GGUF.
//   eagle3: llama.cpp v0.5.0's "eagle3" layout, as its conversion/llama.py writes it (q/k rows
//           permuted for interleaved RoPE, d2t as absolute target ids, target's tokenizer).
//   eagle1: specula's "specula-eagle1" layout (src/runtime/eagle_head.cpp).
// Every failure throws specula::Error with one line naming the problem.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace specula {

struct EagleConvertOptions {
    std::string kind;            // eagle3 | eagle1
    std::string checkpoint_dir;  // config.json + model.safetensors (or model.safetensors.index.json + shards)
    std::string target_gguf;     // the target model the head drafts for
    std::string out_path;
    std::string type = "f16";  // matrices: f16 | f32 | q8_0 (norms, biases stay F32; d2t I64)
};

struct EagleConvertResult {
    int n_tensors = 0;
    int n_draft_vocab = 0;
    std::vector<int> target_layers;  // eagle3
};

EagleConvertResult convert_eagle(const EagleConvertOptions & opts);

// ---- pieces, exposed for tests ----

// One tensor of a safetensors file, converted: floats for F32/F16/BF16/F64, integers for I64/I32/I16/I8/U8/BOOL.
struct SafeTensor {
    std::string dtype;
    std::vector<int64_t> shape;  // as stored (row-major, outermost first)
    std::vector<float> f32;
    std::vector<int64_t> i64;
    int64_t numel() const;
};

// Tensor names -> (file, header entry) of a checkpoint directory; reads tensors on demand.
class SafetensorsCheckpoint {
public:
    explicit SafetensorsCheckpoint(const std::string & dir);
    bool has(const std::string & name) const { return index_.count(name) != 0; }
    std::vector<std::string> names() const;
    const std::vector<int64_t> & shape(const std::string & name) const;
    SafeTensor read(const std::string & name) const;

private:
    struct Entry {
        std::string file, dtype;
        std::vector<int64_t> shape;
        uint64_t begin = 0, end = 0;  // absolute file offsets
    };
    std::map<std::string, Entry> index_;
    void add_file(const std::string & path);
};

// A safetensors file: 8-byte little-endian header length, the header JSON (padded to 8 bytes),
// then `data` as given. For tests and fuzz seeds, which also write malformed headers.
void write_safetensors_file(const std::string & path, const std::string & header_json, std::span<const uint8_t> data);

// llama.cpp's LlamaModel.permute: HF q/k rows (rotate-half pairs i, i + D/2 within each head) to
// interleaved pairs (2i, 2i+1). `w` is [rows, cols] row-major, rows = n_head * D.
std::vector<float> permute_qk_rows(const std::vector<float> & w, int64_t rows, int64_t cols, int n_head);

}  // namespace specula
