#pragma once
// SpecEE predictor sidecars for tests: a valid file by default, any key or tensor spoiled on request.
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gguf.h"
#include "runtime/exit_predictor.h"
#include "runtime/model.h"
#include "test_models.h"

namespace specula::test {

// A predictor sidecar; `edit` may change any key or tensor before it is written.
struct PredictorSpec {
    std::map<std::string, int> ints;
    std::string arch = "specula-specee";
    std::vector<int32_t> layers;
    std::optional<std::vector<int32_t>> offline_layers;  // specula-specee.offline_layers, when set
    int hidden = 3;
    float output_bias = 0.0f;  // > 0: always exits, < 0: never
    std::map<std::string, std::vector<int64_t>> shape_override;
    bool drop_first_tensor = false;
    bool extra_tensor = false;
    bool nan_weight = false;
};

inline std::string write_predictor(const PredictorSpec & s, const Model & target, const std::string & name) {
    const std::string path = test::scratch_dir() + "/" + name + ".gguf";
    gguf_context * g = gguf_init_empty();
    gguf_set_val_str(g, "general.architecture", s.arch.c_str());
    std::map<std::string, int> ints = {{"specula-specee.target_block_count", target.config().n_layer},
                                       {"specula-specee.target_embedding_length", target.config().n_embd},
                                       {"specula-specee.candidates", kExitCandidates},
                                       {"specula-specee.features", kExitFeatures},
                                       {"specula-specee.hidden", s.hidden}};
    for (const auto & [k, v] : s.ints) ints[k] = v;
    for (const auto & [k, v] : ints) gguf_set_val_u32(g, k.c_str(), static_cast<uint32_t>(v));
    gguf_set_arr_data(g, "specula-specee.layers", GGUF_TYPE_INT32, s.layers.data(), s.layers.size());
    if (s.offline_layers) {
        gguf_set_arr_data(g, "specula-specee.offline_layers", GGUF_TYPE_INT32, s.offline_layers->data(), s.offline_layers->size());
    }
    ggml_init_params params{ggml_tensor_overhead() * 64 + (1 << 16), nullptr, false};
    ggml_context * ctx = ggml_init(params);
    bool first = true;
    auto add = [&](const std::string & tensor, std::vector<int64_t> shape, float value) {
        if (auto it = s.shape_override.find(tensor); it != s.shape_override.end()) shape = it->second;
        ggml_tensor * t = shape.size() == 1 ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, shape[0]) : ggml_new_tensor_2d(ctx, GGML_TYPE_F32, shape[0], shape[1]);
        ggml_set_name(t, tensor.c_str());
        float * d = static_cast<float *>(t->data);
        for (int64_t i = 0; i < ggml_nelements(t); ++i) d[i] = value;
        if (s.nan_weight && !first) d[0] = NAN;
        if (!(s.drop_first_tensor && first)) gguf_add_tensor(g, t);
        first = false;
    };
    for (int l : s.layers) {
        const std::string n = "exit." + std::to_string(l) + ".";
        add(n + "fc1.weight", {kExitFeatures, s.hidden}, 0.0f);
        add(n + "fc1.bias", {s.hidden}, 0.0f);
        add(n + "fc2.weight", {s.hidden}, 0.0f);
        add(n + "fc2.bias", {1}, s.output_bias);
    }
    if (s.extra_tensor) add("exit.extra", {1}, 0.0f);
    write_whole(path, [&](const std::string & tmp) { gguf_write_to_file(g, tmp.c_str(), false); });
    gguf_free(g);
    ggml_free(ctx);
    return path;
}

}  // namespace specula::test
