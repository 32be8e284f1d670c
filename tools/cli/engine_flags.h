#pragma once
// The flags every command that opens an Engine/Target shares (device, kernels, drafter, policy,
// tree), defined once so that `generate` and `serve` cannot drift apart.
namespace CLI { class App; }

namespace specula {
struct EngineOptions;
}

namespace specula::cli {

void add_engine_flags(CLI::App * sub, EngineOptions & engine);

}  // namespace specula::cli
