#include "test_models.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <fstream>
#include <gtest/gtest.h>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>
#include <mutex>
#include <stdexcept>

#include "specula/error.h"
#include "model_writer.h"

namespace specula::test {

std::string vocab_dir() { return SPECULA_VOCAB_DIR; }

CommandRun run_command(const std::string & command) {
    const std::string base = scratch_file("command");
    const int status = std::system((command + " >" + base + ".out 2>" + base + ".err").c_str());
    CommandRun r;
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    auto slurp = [](const std::string & path) {
        std::ifstream in(path);
        std::stringstream s;
        s << in.rdbuf();
        return s.str();
    };
    r.out = slurp(base + ".out");
    r.err = slurp(base + ".err");
    return r;
}

void expect_cli_error(const std::string & cli, const std::string & args, const std::string & text) {
    const CommandRun r = run_command(cli + " " + args);
    EXPECT_EQ(r.signal, 0) << args;
    EXPECT_EQ(r.exit_code, 1) << args << "\n"
                              << r.err;
    std::vector<std::string> lines;
    std::istringstream in(r.err);
    // Progress lines ("[specula] loading ...: 1/3 weights") may come before the failing step; the
    // error itself must be one line.
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.rfind("[specula] ", 0) != 0) lines.push_back(line);
    }
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_EQ(lines[0].rfind("specula: error: ", 0), 0u) << lines[0];
    EXPECT_NE(lines[0].find(text), std::string::npos) << lines[0];
}

std::string error_message(const std::function<void()> & f) {
    try {
        f();
    } catch (const Error & e) {
        return e.what();
    }
    return "<no error>";
}

std::string shipped_model(const std::string & name) { return std::string(SPECULA_SOURCE_DIR) + "/models/" + name; }

std::vector<int32_t> tokenize_pieces(const Tokenizer & tok, const std::vector<std::pair<std::string, SpecialTokens>> & pieces) {
    std::vector<int32_t> out = tok.tokenize("", true);
    for (const auto & [piece, specials] : pieces) {
        const std::vector<int32_t> t = tok.tokenize(piece, false, specials);
        out.insert(out.end(), t.begin(), t.end());
    }
    return out;
}

void write_whole(const std::string & path, const std::function<void(const std::string &)> & write) {
    const std::string tmp = path + ".tmp" + std::to_string(::getpid());
    write(tmp);
    std::filesystem::rename(tmp, path);
}

std::string scratch_dir() {
    const std::string dir = std::string(SPECULA_TEST_DIR) + "/test-models";
    std::filesystem::create_directories(dir);
    return dir;
}

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
    constexpr double kFail = std::numeric_limits<double>::infinity();
    if (a.size() != b.size()) return kFail;
    double m = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (a[i] == b[i]) continue;
        const double d = std::fabs(double(a[i]) - double(b[i]));
        if (!std::isfinite(d)) return kFail;
        m = std::max(m, d);
    }
    return m;
}

std::string scratch_file(const std::string & name) {
    const ::testing::TestInfo * info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string test = info ? std::string(info->test_suite_name()) + "." + info->name() : "no-test";
    std::replace(test.begin(), test.end(), '/', '_');  // parameterized names: "Cached/Suite.Test/0"
    return scratch_dir() + "/" + test + "-" + std::to_string(::getpid()) + "-" + name;
}

const std::vector<Variant> & oracle_variants() {
    static const std::vector<Variant> v = {
        // name            arch     vocab                       E   L  H KV  D   FF  tied  type
        {"llama_gqa_f32", "llama", "ggml-vocab-llama-spm.gguf", 64, 2, 4, 2, 0, 128, false, "f32"},
        {"llama_tied_f16", "llama", "ggml-vocab-llama-spm.gguf", 64, 2, 4, 4, 0, 128, true, "f16"},
        {"llama_bf16", "llama", "ggml-vocab-llama-spm.gguf", 64, 2, 4, 2, 0, 128, false, "bf16"},
        {"llama_q8_0", "llama", "ggml-vocab-llama-spm.gguf", 64, 2, 4, 2, 0, 128, false, "q8_0"},
        {"llama_q4_0", "llama", "ggml-vocab-llama-spm.gguf", 64, 2, 4, 2, 0, 128, false, "q4_0"},
        {"llama_q4_1_tied", "llama", "ggml-vocab-llama-spm.gguf", 64, 2, 4, 2, 0, 128, true, "q4_1"},
        {"llama_q5_0", "llama", "ggml-vocab-llama-spm.gguf", 64, 2, 4, 2, 0, 128, false, "q5_0"},
        {"llama_q4_k", "llama", "ggml-vocab-llama-spm.gguf", 256, 2, 4, 2, 0, 256, false, "q4_k"},
        {"llama_q6_k", "llama", "ggml-vocab-llama-spm.gguf", 256, 2, 4, 2, 0, 256, true, "q6_k"},
        {"llama3_bpe_tied", "llama", "ggml-vocab-llama-bpe.gguf", 64, 2, 4, 2, 0, 128, true, "f32"},
        {"qwen2_bias", "qwen2", "ggml-vocab-qwen2.gguf", 64, 2, 4, 2, 0, 128, true, "f32"},
        {"llama_draft_small", "llama", "ggml-vocab-llama-spm.gguf", 32, 1, 2, 1, 0, 64, false, "f32"},
        {"qwen3_qknorm", "qwen3", "ggml-vocab-qwen2.gguf", 64, 2, 4, 2, 32, 128, true, "f32"},
        // window 8, layers 0-1 sliding and 2 global, softcapped logits (write_variant)
        {"gemma3_swa", "gemma3", "ggml-vocab-llama-spm.gguf", 64, 3, 4, 2, 32, 128, true, "f32"},
        {"gemma3_swa_q8_0", "gemma3", "ggml-vocab-llama-spm.gguf", 64, 3, 4, 1, 32, 128, true, "q8_0"},
    };
    return v;
}

namespace {
std::string write_variant(const Variant & v, const std::string & file_name, const std::string & type) {
    const std::string path = scratch_dir() + "/" + file_name + ".gguf";
    if (!std::filesystem::exists(path)) {
        RandomModelSpec s;
        s.arch = v.arch;
        s.vocab_gguf = vocab_dir() + "/" + v.vocab;
        s.n_embd = v.n_embd, s.n_layer = v.n_layer, s.n_head = v.n_head, s.n_head_kv = v.n_head_kv;
        s.head_dim = v.head_dim, s.n_ff = v.n_ff, s.tied_output = v.tied, s.weight_type = type;
        s.seed = std::hash<std::string>{}(v.name) & 0xffff;
        if (v.arch == "gemma3") {  // a window far shorter than the oracle's sequences, so that it masks
            s.sliding_window = 8, s.sliding_period = 3, s.final_logit_softcap = 30.0f;
        }
        write_whole(path, [&](const std::string & tmp) { write_random_model(s, tmp); });
    }
    return path;
}

const Variant & find_variant(const std::string & name) {
    for (const Variant & v : oracle_variants()) {
        if (v.name == name) return v;
    }
    throw std::runtime_error("unknown test model " + name);
}
}  // namespace

std::string model_path(const std::string & name) {
    static std::mutex mu;
    std::lock_guard lock(mu);
    const Variant & v = find_variant(name);
    return write_variant(v, v.name, v.type);
}

std::string quantized_twin(const std::string & name, const std::string & type) {
    const Variant & v = find_variant(name);
    return write_variant(v, v.name + "_twin_" + type, type);
}

std::string eagle_head_path(const std::string & kind, const std::string & target, int n_draft_vocab, int hidden,
                            std::vector<int> target_layers) {
    const Variant & v = find_variant(target);
    std::string name = kind + "_for_" + target + "_v" + std::to_string(n_draft_vocab) + "_h" + std::to_string(hidden);
    for (int l : target_layers) name += "_l" + std::to_string(l);
    const std::string path = scratch_dir() + "/" + name + ".gguf";
    if (!std::filesystem::exists(path)) {
        RandomEagleSpec e;
        e.kind = kind;
        e.target.vocab_gguf = vocab_dir() + "/" + v.vocab;
        e.target.n_embd = hidden ? hidden : v.n_embd;
        e.target.n_layer = v.n_layer;
        e.n_draft_vocab = n_draft_vocab;
        e.target_layers = target_layers;
        e.seed = std::hash<std::string>{}(name)&0xffff;
        write_whole(path, [&](const std::string & tmp) { write_random_eagle_head(e, tmp); });
    }
    return path;
}

namespace {
RandomModelSpec tiny_vocab_spec(int n_vocab, uint64_t seed) {
    RandomModelSpec s;
    s.n_vocab = n_vocab;
    s.n_embd = 32, s.n_layer = 1, s.n_head = 2, s.n_head_kv = 2, s.n_ff = 64, s.seed = seed;
    return s;
}
}  // namespace

std::string tiny_vocab_model(const std::string & name, int n_vocab, uint64_t seed) {
    const std::string path = scratch_dir() + "/" + name + ".gguf";
    if (!std::filesystem::exists(path)) {
        write_whole(path, [&](const std::string & tmp) { write_random_model(tiny_vocab_spec(n_vocab, seed), tmp); });
    }
    return path;
}

std::string tiny_vocab_eagle_head(const std::string & kind, int n_vocab, uint64_t seed) {
    const std::string path = scratch_dir() + "/tiny_" + kind + "_h2_v" + std::to_string(n_vocab) + "_s" + std::to_string(seed) + ".gguf";
    if (!std::filesystem::exists(path)) {
        RandomEagleSpec e;
        e.kind = kind;
        e.target = tiny_vocab_spec(n_vocab, seed);
        e.n_head = 2, e.n_head_kv = 1, e.n_ff = 64;  // head size 16, as specula's attention op needs
        e.seed = seed;
        write_whole(path, [&](const std::string & tmp) { write_random_eagle_head(e, tmp); });
    }
    return path;
}

GenerationOptions fixed_length_options(int n, float temperature, uint64_t seed) {
    GenerationOptions g;
    g.n_predict = n;
    g.sampling.temperature = temperature;
    g.sampling.seed = seed;
    g.stop_at_end_of_generation = false;
    return g;
}

}  // namespace specula::test
