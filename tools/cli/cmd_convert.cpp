// specula convert-eagle: public EAGLE-1 / EAGLE-3 checkpoints (config.json + safetensors) -> GGUF.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "commands.h"
#include "eagle_convert.h"

namespace specula::cli {

void register_convert(CLI::App & app, Commands & commands) {
    auto opts = std::make_shared<EagleConvertOptions>();
    CLI::App * sub = app.add_subcommand(command::convert_eagle.name, command::convert_eagle.description);
    sub->add_option("--kind", opts->kind, "eagle3 (llama.cpp's eagle3 layout) | eagle1 (specula-eagle1 layout)")->required()->check(CLI::IsMember({"eagle3", "eagle1"}));
    sub->add_option("--checkpoint", opts->checkpoint_dir, "checkpoint directory: config.json + *.safetensors")->required();
    sub->add_option("--target", opts->target_gguf, "the target model's GGUF (sizes are checked, tokenizer copied)")->required();
    sub->add_option("-o,--output", opts->out_path, "output GGUF path")->required();
    sub->add_option("--type", opts->type, "matrix type: f16 | f32 | q8_0 (norms and biases stay F32)")->default_val("f16");
    sub->callback([opts, &commands] {
        commands.run = [opts] {
            const EagleConvertResult r = convert_eagle(*opts);
            std::printf("wrote %s: %s head, %d tensors, draft vocabulary %d", opts->out_path.c_str(), opts->kind.c_str(), r.n_tensors,
                        r.n_draft_vocab);
            if (!r.target_layers.empty()) {
                std::printf(", target layers [%d, %d, %d]", r.target_layers[0], r.target_layers[1], r.target_layers[2]);
            }
            std::printf("\n");
            return 0;
        };
    });
}

}  // namespace specula::cli
