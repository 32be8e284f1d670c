#include "gguf_edit.h"

#include <cstring>

#include "specula/error.h"
#include "ggml.h"
#include "gguf.h"
#include "runtime/gguf_file.h"

namespace specula {

std::vector<float> read_f32(const GgufFile & f, const std::string & name) {
    ggml_tensor * meta = f.tensor_meta(name);
    if (!meta) throw Error(f.path() + ": missing tensor " + name);
    const std::vector<uint8_t> raw = f.read_tensor_bytes(name);
    std::vector<float> out(ggml_nelements(meta));
    if (meta->type == GGML_TYPE_F32) {
        std::memcpy(out.data(), raw.data(), raw.size());
    } else {
        const auto * traits = ggml_get_type_traits(meta->type);
        if (!traits->to_float) throw Error(f.path() + ": cannot read tensor " + name + " as floats");
        traits->to_float(raw.data(), out.data(), static_cast<int64_t>(out.size()));
    }
    return out;
}

gguf_context * metadata_of(const std::string & path) {
    ggml_context * meta = nullptr;
    gguf_init_params p{true, &meta};
    gguf_context * src = gguf_init_from_file(path.c_str(), p);
    if (!src) throw Error(path + ": cannot read GGUF metadata");
    gguf_context * out = gguf_init_empty();
    gguf_set_kv(out, src);
    gguf_free(src);
    ggml_free(meta);
    return out;
}

void write_gguf(gguf_context * out, ggml_context * ctx, const std::string & path) {
    const bool ok = gguf_write_to_file(out, path.c_str(), false);
    gguf_free(out);
    ggml_free(ctx);
    if (!ok) throw Error(path + ": could not write");
}

}  // namespace specula
