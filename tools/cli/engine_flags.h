#pragma once
// The flags every command that opens an Engine/Target shares (device, kernels, drafter, policy,
// tree) and the default model, defined once so that `generate` and `serve` cannot drift apart.
namespace CLI { class App; }

namespace specula {
struct EngineOptions;
}

namespace specula::cli {

void add_engine_flags(CLI::App * sub, EngineOptions & engine);

// No -m: SmolLM2-135M-Instruct from the model cache scripts/fetch_models.sh fills (same variable,
// same default), fetched on first use, drafting with its EAGLE-3 head from models/ unless another
// drafter was chosen. Throws Error when the model cannot be fetched.
void use_default_model(EngineOptions & engine);

}  // namespace specula::cli
