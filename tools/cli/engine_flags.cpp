#include "engine_flags.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/model_cache.h"
#include "specula/error.h"
#include "specula/specula.h"
#include "tokenizer/chat_template.h"

extern "C" {
#include "hash/sha256/sha256.h"  // llama.cpp's vendored SHA-256
}

namespace specula::cli {
namespace {

// scripts/fetch_models.sh's smollm2_gguf and smollm2_sha256 (tools/cli/CMakeLists.txt reads them).
constexpr const char * kDefaultModel = SPECULA_DEFAULT_MODEL;
constexpr const char * kDefaultModelSha256 = SPECULA_DEFAULT_MODEL_SHA256;
constexpr const char * kDefaultHead = "models/smollm2-eagle3.gguf";

// --draft / --eagle / --eagle3 / --ngram: each names the one drafter.
void choose_drafter(DrafterSpec & spec, DrafterKind kind, const std::string & path) {
    if (spec.kind != DrafterKind::None) throw Error("choose one drafter: --draft, --eagle, --eagle3 or --ngram");
    spec.kind = kind;
    spec.path = path;
}

// A file's Jinja text, or the name of one of llama.cpp's built-in templates (llama-server's
// --chat-template NAME); a file of that name comes first.
std::string read_chat_template(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        const std::vector<std::string> names = ChatTemplate::builtin_template_names();
        if (std::find(names.begin(), names.end(), path) != names.end()) return path;
        std::string list;
        for (const std::string & n : names) list += (list.empty() ? "" : ", ") + n;
        throw Error("--chat-template " + path + ": cannot read the file, and it names none of llama.cpp's built-in templates (" + list + ")");
    }
    std::ostringstream text;
    text << in.rdbuf();
    if (text.str().empty()) throw Error("--chat-template " + path + ": the file is empty");
    return text.str();
}

std::string sha256_of_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("cannot read " + path);
    sha256_t state;
    sha256_init(&state);
    std::vector<char> chunk(1 << 20);
    while (in) {
        in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
        sha256_update(&state, reinterpret_cast<const unsigned char *>(chunk.data()), static_cast<size_t>(in.gcount()));
    }
    unsigned char digest[SHA256_DIGEST_SIZE];
    sha256_final(&state, digest);
    std::string hex;
    for (const unsigned char byte : digest) {
        hex += "0123456789abcdef"[byte >> 4];
        hex += "0123456789abcdef"[byte & 15];
    }
    return hex;
}

}  // namespace

void choose_model_and_drafter(EngineOptions & engine, bool no_spec) {
    if (no_spec) {
        if (engine.drafter.kind != DrafterKind::None) throw Error("--no-spec decodes plainly: drop --draft, --eagle, --eagle3 or --ngram");
        if (!engine.specee_path.empty()) throw Error("--no-spec decodes plainly: drop --specee");
        if (engine.drafter.lookup.value_or(false)) throw Error("--no-spec decodes plainly: drop --lookup");
    }
    if (engine.model_path.empty()) {
        const std::string path = model_cache_dir() + "/" + kDefaultModel;
        if (!std::filesystem::exists(path)) {
            const std::string fetch = std::string(SPECULA_SOURCE_DIR) + "/scripts/fetch_models.sh";
            std::fprintf(stderr, "[specula] no -m given and %s is absent: running %s\n", path.c_str(), fetch.c_str());
            if (std::system(fetch.c_str()) != 0 || !std::filesystem::exists(path)) {
                throw Error("the default model " + path + " could not be fetched (see the line above); pass -m MODEL.gguf");
            }
        }
        // The cache is a directory anyone may write to: the file the run trusts by name is checked
        // against the pin, as fetch_models.sh checks what it downloads.
        if (const std::string actual = sha256_of_file(path); actual != kDefaultModelSha256) {
            throw Error("the default model " + path + " has sha256 " + actual + ", not the pinned " + kDefaultModelSha256 +
                        ": delete it and run scripts/fetch_models.sh, or pass -m MODEL.gguf");
        }
        engine.model_path = path;
        if (engine.drafter.kind == DrafterKind::None && !no_spec) {
            engine.drafter = {DrafterKind::Eagle3, std::string(SPECULA_SOURCE_DIR) + "/" + kDefaultHead};
        }
    }
    // --lookup without a model drafter and --specee without a head keep their own errors.
    const bool asks_for_model_drafter = engine.drafter.lookup.value_or(false) || !engine.specee_path.empty();
    if (engine.drafter.kind == DrafterKind::None && !no_spec && !asks_for_model_drafter) engine.drafter.kind = DrafterKind::Ngram;
}

std::string decoding_mode(const EngineOptions & engine) {
    const DrafterSpec & d = engine.drafter;
    const std::string specee = engine.specee_path.empty() ? "" : ", SpecEE predictors " + engine.specee_path;
    switch (d.kind) {
        case DrafterKind::None: return "plain decoding (no drafter)";
        case DrafterKind::Ngram: return "speculative, drafting by prompt lookup (n-grams)";
        case DrafterKind::DraftModel:
            return "speculative, drafting with " + d.path + " (draft model" +
                   (d.vocab > 0 ? ", logits over the first " + std::to_string(d.vocab) + " token ids and the control tokens" : "") +
                   (d.vocab_file.empty() ? "" : ", logits over the vocabulary of " + d.vocab_file) + ")";
        case DrafterKind::Eagle: return "speculative, drafting with " + d.path + " (EAGLE head)" + specee;
        case DrafterKind::Eagle3: return "speculative, drafting with " + d.path + " (EAGLE-3 head)" + specee;
    }
    return {};
}

void add_draft_vocab_flag(CLI::App * sub, int & count, std::string & file, const std::string & what) {
    sub->add_option_function<std::string>(
        "--draft-vocab",
        [&count, &file](const std::string & value) {
            const bool digits = !value.empty() && value.find_first_not_of("0123456789") == std::string::npos;
            if (digits && value.size() > 9) throw Error("--draft-vocab " + value + ": not a token count");
            count = digits ? std::stoi(value) : 0;
            file = digits ? "" : value;
        },
        what +
            ": the draft model's logits over a trimmed vocabulary, FILE (`specula draft-vocab` writes one: a corpus's most frequent "
            "tokens) or the first N token ids, both with the control and end-of-generation tokens (its LM head reads only those rows; "
            "the target still decides every token); 0 = the whole vocabulary");
}

void add_sampling_flags(CLI::App * sub, SamplingParams & s) {
    sub->add_option("--temp", s.temperature, "temperature (0 = greedy)")->capture_default_str();
    sub->add_option("--top-k", s.top_k, "top-k (0 = off)")->capture_default_str();
    sub->add_option("--top-p", s.top_p, "top-p (1 = off)")->capture_default_str();
    sub->add_option("--min-p", s.min_p, "min-p (0 = off)")->capture_default_str();
    sub->add_option("--seed", s.seed, "random seed")->capture_default_str();
    sub->add_option("--repeat-penalty", s.repeat_penalty, "divide the logit of a recent token by this (1 = off)")->capture_default_str();
    sub->add_option("--presence-penalty", s.presence_penalty, "subtract this from a recent token's logit (0 = off)")->capture_default_str();
    sub->add_option("--frequency-penalty", s.frequency_penalty, "subtract this per occurrence of a recent token (0 = off)")->capture_default_str();
    sub->add_option("--penalty-last-n", s.penalty_last_n, "the recent tokens the penalties count, prompt included (-1 = all)")->capture_default_str();
}

void add_engine_flags(CLI::App * sub, EngineOptions & e, bool & no_spec) {
    sub->add_option("-t,--threads", e.n_threads, "CPU threads (0 = physical cores)")->capture_default_str();
    sub->add_option("--device", e.device,
                    "ggml device: cpu, CUDA0 / Metal / Vulkan0 in such a build, RPC[host:port] (an rpc-server), or a comma-separated "
                    "list of them to split the layers across (docs/distributed.md)")
        ->capture_default_str();
    sub->add_option("--split", e.split, "with a device list: each device's share of the layers, e.g. 1,3 (default: by free memory)");
    sub->add_option("--rpc-timeout", e.rpc_timeout, "seconds an rpc-server may take to answer a forward before the run ends with an error")
        ->capture_default_str();
    add_choice(sub, "--kernels", e.kernels, parse_kernels, "matmul kernels: auto (default; specula's on the local CPU, also for its share of a device list) | specula | ggml");
    add_choice(sub, "--attention", e.attention, parse_attention,
               "attention kernel: auto (default; specula's with specula's kernels on --device cpu, else matmul on CPU, flash on GPU and device lists) | flash | matmul | specula");
    DrafterSpec & d = e.drafter;
    sub->add_option_function<std::string>(
        "--draft", [&d](const std::string & p) { choose_drafter(d, DrafterKind::DraftModel, p); },
        "draft model GGUF (same vocabulary as the target)");
    sub->add_option_function<std::string>(
        "--eagle", [&d](const std::string & p) { choose_drafter(d, DrafterKind::Eagle, p); },
        "EAGLE-1/2 head GGUF for the target (default tree: dynamic)");
    sub->add_option_function<std::string>(
        "--eagle3", [&d](const std::string & p) { choose_drafter(d, DrafterKind::Eagle3, p); },
        "EAGLE-3 head GGUF for the target, llama.cpp layout (default tree: dynamic)");
    sub->add_flag_callback(
        "--ngram", [&d] { choose_drafter(d, DrafterKind::Ngram, ""); },
        "draft by prompt lookup (n-gram matching; the default without a drafter)");
    sub->add_flag("--no-spec", no_spec, "plain decoding: no drafter, not even prompt lookup");
    sub->add_flag_callback(
        "--lookup", [&d] { d.lookup = true; },
        "with --draft, --eagle or --eagle3: prompt lookup's continuation grafted into each tree, or weighed against each chain "
        "as a free chain under the cost policy (default: on for trees the tree policy sizes)");
    sub->add_flag_callback(
        "--no-lookup", [&d] { d.lookup = false; }, "draft with the model alone (no prompt-lookup graft)");
    sub->add_flag_callback(
        "--cascade", [&d] { d.cascade = true; },
        "with --draft: chains start from prompt lookup's continuation, checked by the draft model's first forward (the default)");
    sub->add_flag_callback(
        "--no-cascade", [&d] { d.cascade = false; }, "with --draft: the draft model drafts every token of its chains itself");
    sub->add_option("--ngram-min", d.ngram_min, "shortest n-gram to match")->capture_default_str();
    sub->add_option("--ngram-max", d.ngram_max, "longest n-gram to match")->capture_default_str();
    add_draft_vocab_flag(sub, d.vocab, d.vocab_file, "with --draft");
    sub->add_option("--draft-max", e.draft_max, "longest draft per round")->capture_default_str();
    add_choice(sub, "--draft-policy", e.draft_policy, parse_draft_policy, "draft length policy: cost (default) | heuristic | fixed");
    sub->add_option_function<std::string>(
        "--tree", [&e](const std::string & s) { e.tree = parse_tree_shape(s); },
        "draft shape: chain | static | dynamic (default: dynamic for EAGLE heads, else chain)");
    sub->add_option("--tree-depth", e.tree_depth, "tree depth below the root")->capture_default_str();
    sub->add_option("--tree-branching", e.tree_branching, "dynamic tree: children per node and nodes expanded per depth")->capture_default_str();
    sub->add_option("--tree-nodes", e.tree_nodes, "nodes verified per round (0 = from the measured verify cost)")->capture_default_str();
    sub->add_option_function<std::string>(
        "--chat-template", [&e](const std::string & path) { e.chat_template = read_chat_template(path); },
        "chat template used instead of the model's (chat messages, tools): a Jinja FILE, or the NAME of one of llama.cpp's built-in templates (chatml, llama3, ...)");
}

}  // namespace specula::cli
