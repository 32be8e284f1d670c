#pragma once
// Shared by every benchmark: robust statistics, the machine-load check, running peer tools.
#include <string>
#include <vector>

namespace specula::bench {

struct Summary {
    double median = 0, min = 0, max = 0;
    int n = 0;
};
Summary summarize(std::vector<double> samples);

// How busy the machine was over `seconds` before a benchmark, from /proc/stat (all cores).
struct MachineLoad {
    double busy_fraction = 0;  // 0..1
    double loadavg_1m = 0;
    std::string cpu;  // cpu_description(): every figure names the machine it was measured on
    bool idle() const { return busy_fraction < 0.10; }
};
MachineLoad measure_machine_load(double seconds = 1.0);
// "AMD EPYC (family 25 model 17), 2 cpus, kernels avx512vnni": /proc/cpuinfo's model name, family
// and model (which tell CPU generations apart where the name does not), and specula's kernel path.
std::string cpu_description();
// "machine: N% busy before start, loadavg X", flagged when not idle.
void print_machine(const MachineLoad & load);

// The categorised prompt set ({"prompts": [{"category", "name", "text"}, ...]}); an empty path
// means tools/bench/prompts.json of the source tree. Throws Error on a missing, malformed or empty set.
// A prompt may carry a "json_schema" (an object) its reply must follow: only benchmarks that
// constrain their generations to it read such sets (schemas_allowed); the others refuse them.
struct PromptText {
    std::string category, name, text;
    std::string json_schema;  // the schema as JSON text; empty: unconstrained
};
struct PromptSet {
    bool chat = false;  // "chat": true: each text is a user message for the model's chat template
    std::vector<PromptText> prompts;
};
PromptSet read_prompt_set(const std::string & path, bool schemas_allowed = false);
std::string prompt_set_path(const std::string & path);

// Whether the pinned llama.cpp can run an EAGLE-3 head on this target: v0.5.0 taps the layer inputs
// the head reads only in some architectures' graphs (its src/models/*.cpp that set t_layer_inp;
// of specula's families: llama and qwen3, not qwen2 or gemma3, where it aborts). When it cannot,
// the benchmarks leave llama.cpp's EAGLE-3 out and say why (llama_eagle3_absent_note).
bool llama_cpp_runs_eagle3_on(const std::string & target_path);
std::string llama_eagle3_absent_note(const std::string & target_path);

// Path of a llama.cpp peer binary built by `cmake --build build --target peers`; throws if missing.
std::string peer_binary(const std::string & name);
// Runs a command, returns its stdout; throws Error with its stderr tail on failure.
std::string run_command(const std::string & cmd);
// Writes a benchmark's result file (its --json), creating the folders on its path, and prints
// "wrote PATH"; throws Error naming the path when it cannot.
void write_result(const std::string & path, const std::string & text);

}  // namespace specula::bench
