#pragma once
// Random-weight fixture models, written once per build into the build tree and reused.
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "specula/specula.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "tokenizer/tokenizer.h"

namespace specula::test {

// n tokens whatever the model emits (end-of-generation tokens do not stop it), at `temperature`
// and `seed`.
GenerationOptions fixed_length_options(int n, float temperature = 0.0f, uint64_t seed = 1);

struct Variant {
    std::string name;
    std::string arch;
    std::string vocab;  // file name under llama.cpp's models/
    int n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff;
    bool tied;
    std::string type;
};

// Every supported family and option: GQA, tied output, qwen2 biases, qwen3 q/k norm, weight types.
const std::vector<Variant> & oracle_variants();
// Path of the model for `name` (one of oracle_variants()), created on first use.
std::string model_path(const std::string & name);

// The fixture model `variant` loaded on one CPU thread, with a runner for its forwards.
struct LoadedModel {
    Backend backend{BackendOptions{"cpu", 1}};
    std::unique_ptr<Model> model;
    std::unique_ptr<ModelRunner> runner;
    explicit LoadedModel(const std::string & variant)
        : model(Model::load(model_path(variant), backend)), runner(std::make_unique<ModelRunner>(*model)) {}
};
// The same weights as `name`, stored as `type`: a draft that mostly agrees with its target.
std::string quantized_twin(const std::string & name, const std::string & type);
// A random EAGLE head ("eagle1" | "eagle3") for the fixture model `target`; n_draft_vocab > 0
// gives an EAGLE-3 head a compact vocabulary with d2t; hidden != 0 pretends a target of that width.
std::string eagle_head_path(const std::string & kind, const std::string & target, int n_draft_vocab = 0, int hidden = 0,
                            std::vector<int> target_layers = {});
// A model with n_vocab tokens and no tokenizer (runtime only): distribution tests.
std::string tiny_vocab_model(const std::string & name, int n_vocab, uint64_t seed);
// A random EAGLE head ("eagle1" | "eagle3") for tiny_vocab_model(*, n_vocab, *): distribution tests.
std::string tiny_vocab_eagle_head(const std::string & kind, int n_vocab, uint64_t seed);
std::string vocab_dir();
// The message of the specula::Error that `f` throws, or "<no error>".
std::string error_message(const std::function<void()> & f);
std::string scratch_dir();
// Writes `path` through write(temporary path), then renames it into place: tests run in parallel
// processes (ctest -j) see a shared fixture whole or not at all.
void write_whole(const std::string & path, const std::function<void(const std::string &)> & write);
// A file under scratch_dir() for the running test only: named by its suite, its name and the
// process, so that tests run at once (ctest -j) never share one.
std::string scratch_file(const std::string & name);
// Largest |a[i] - b[i]|. Equal infinities (masked logits) agree; a NaN on either side, an infinity
// on one side only, or different sizes give +infinity, so that any bound on the result fails
// (`m = std::max(m, fabs(a - b))` silently keeps m when the difference is NaN).
double max_abs_diff(std::span<const float> a, std::span<const float> b);
// A file of the repository's models/ (the bundled family, the SmolLM2 head).
std::string shipped_model(const std::string & name);
// BOS (when the vocabulary adds one), then each piece tokenized on its own with its specials: a
// chat prompt's markup (Parse) and contents (Text) as Tokenizer::tokenize_chat keeps them apart.
std::vector<int32_t> tokenize_pieces(const Tokenizer & tok, const std::vector<std::pair<std::string, SpecialTokens>> & pieces);

struct CommandRun {
    int exit_code = -1;
    int signal = 0;
    std::string out, err;
};
// Runs a shell command, capturing its stdout and stderr.
CommandRun run_command(const std::string & command);
// The CLI's error contract: exit code 1, no signal, and stderr's only non-empty line is
// `specula: error: <... text ...>`.
void expect_cli_error(const std::string & cli, const std::string & args, const std::string & text);

}  // namespace specula::test
