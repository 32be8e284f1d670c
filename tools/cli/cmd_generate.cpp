#include <algorithm>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "constrain/grammar.h"
#include "engine_flags.h"
#include "specula/specula.h"
#include "tokenizer/stop_strings.h"
#include "trace/trace.h"

namespace specula::cli {

namespace {
std::string read_text(const std::string & path, const char * what) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("cannot read the " + std::string(what) + " file " + path);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

// --grammar-file or --json-schema as the GBNF of GenerationOptions::grammar.
std::string output_grammar(const std::string & grammar_path, const std::string & schema_path) {
    if (!grammar_path.empty()) return read_text(grammar_path, "grammar");
    if (schema_path.empty()) return {};
    const nlohmann::json schema = nlohmann::json::parse(read_text(schema_path, "JSON schema"), nullptr, /*allow_exceptions=*/false);
    if (schema.is_discarded()) throw Error("the JSON schema file " + schema_path + " is not JSON");
    return json_schema_to_gbnf(schema);
}

// --messages: a JSON array of {"role": ..., "content": ...} objects, as a chat request's messages.
std::vector<std::pair<std::string, std::string>> read_messages(const std::string & path) {
    const nlohmann::json doc = nlohmann::json::parse(read_text(path, "messages"), nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) throw Error("the messages file " + path + " is not JSON");
    if (!doc.is_array() || doc.empty()) throw Error("the messages file " + path + " is not a non-empty array of messages");
    std::vector<std::pair<std::string, std::string>> messages;
    for (size_t i = 0; i < doc.size(); ++i) {
        const nlohmann::json & m = doc[i];
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") || !m["content"].is_string()) {
            throw Error("the messages file " + path + ": message " + std::to_string(i) + " is not an object with a string \"role\" and \"content\"");
        }
        for (const auto & [key, value] : m.items()) {
            if (key != "role" && key != "content") throw Error("the messages file " + path + ": message " + std::to_string(i) + " has a field \"" + key + "\" this command does not read");
        }
        messages.emplace_back(m["role"].get<std::string>(), m["content"].get<std::string>());
    }
    return messages;
}
}  // namespace

void register_generate(CLI::App & app, Commands & commands) {
    struct Args {
        EngineOptions engine;
        GenerationOptions gen;
        std::string prompt;
        std::string messages_path;
        std::string trace_path;
        std::string grammar_path, schema_path;
        std::vector<std::string> stop;
        bool no_spec = false;
    };
    auto args = std::make_shared<Args>();
    CLI::App * sub = app.add_subcommand("generate", "generate text from a prompt, streaming it to stdout");
    sub->add_option("-m,--model", args->engine.model_path,
                    "target model GGUF (default: SmolLM2-135M-Instruct from the model cache, fetched if absent, as a chat "
                    "with its EAGLE-3 head unless another drafter is given)");
    auto * prompt = sub->add_option("-p,--prompt", args->prompt, "prompt text");
    sub->add_option("-n,--n-predict", args->gen.n_predict, "tokens to generate")->capture_default_str();
    sub->add_option("-c,--ctx-size", args->engine.n_ctx, "context size in tokens")->capture_default_str();
    add_sampling_flags(sub, args->gen.sampling);
    auto * grammar = sub->add_option("--grammar-file", args->grammar_path, "constrain the output to this GBNF grammar (llama.cpp's format)");
    sub->add_option("--json-schema", args->schema_path, "constrain the output to JSON that this JSON-schema file describes")->excludes(grammar);
    sub->add_option("--stop", args->stop, "end the output where this text starts, itself not printed (repeatable)");
    add_engine_flags(sub, args->engine, args->no_spec);
    sub->add_option("--specee", args->engine.specee_path,
                    "SpecEE exit predictors GGUF (models/*-specee.gguf): lossy early exit at T=0 with the EAGLE-3 head's top 4 as candidates");
    sub->add_flag("--specee-lossless", args->engine.specee_lossless,
                  "SpecEE's lossless mode: exited tokens are drafts the full target verifies (output identical to plain)");
    sub->add_option("--specee-threshold", args->engine.specee_threshold, "exit above this predictor probability (default: the file's; 1 = never)");
    sub->add_flag("--specee-online", args->engine.specee_online, "also probe near the recent tokens' exit layers (docs/specee.md)");
    sub->add_option("--trace", args->trace_path, "write a per-token JSON-lines trace of speculative rounds (SpecEE: each token's exit layer)");
    auto * chat = sub->add_flag("--chat", args->gen.chat, "format the prompt with the model's chat template (as a user message)");
    sub->add_option("--messages", args->messages_path,
                    "a conversation instead of --prompt: a JSON file holding an array of {\"role\", \"content\"} messages, rendered "
                    "by the model's chat template as the server renders a chat request's")
        ->excludes(prompt)
        ->excludes(chat);
    sub->add_flag(
        "--ignore-eos", [args](int64_t) { args->gen.stop_at_end_of_generation = false; }, "keep generating after end-of-generation tokens");
    commands.run = nullptr;
    sub->callback([args, prompt, &commands] {
        if (prompt->count() == 0 && args->messages_path.empty()) throw Error("--prompt is required (or --messages FILE)");
        commands.run = [args] {
            const auto messages = args->messages_path.empty() ? std::vector<std::pair<std::string, std::string>>{} : read_messages(args->messages_path);
            if (!messages.empty()) args->gen.chat = true;
            // The default model is an instruct model: a chat.
            if (args->engine.model_path.empty()) args->gen.chat = true;
            choose_model_and_drafter(args->engine, args->no_spec);
            args->gen.grammar = output_grammar(args->grammar_path, args->schema_path);
            auto engine = Engine::open(args->engine);
            std::unique_ptr<TraceWriter> trace;
            if (!args->trace_path.empty()) {
                trace = std::make_unique<TraceWriter>(args->trace_path, [&](int32_t t) { return engine->piece(t); });
                args->gen.on_round = [&](const RoundReport & round) { trace->round(round); };
                args->gen.on_exit = [&](const ExitReport & token) { trace->exit(token); };
            }
            // A completion continues the prompt, so the prompt is printed first; a chat's reply is
            // an answer to it, printed alone.
            if (!args->gen.chat) std::fputs(args->prompt.c_str(), stdout);
            StopStrings stops(args->stop);
            const PieceSink print = [&stops](const std::string & piece) {
                std::fputs(stops.push(piece).c_str(), stdout);
                std::fflush(stdout);
                return !stops.stopped();  // the generation ends at the token a stop string ends in
            };
            const GenerationStats s = messages.empty() ? engine->generate(args->prompt, args->gen, print)
                                                       : engine->generate(engine->tokenize_chat(messages), args->gen, print);
            std::fputs(stops.flush().c_str(), stdout);
            std::fprintf(stderr, "\n[specula] prompt %d tok, %.1f tok/s | generated %d tok, %.1f tok/s\n", s.n_prompt,
                         s.prompt_tok_s(), s.n_generated, s.generation_tok_s());
            std::fprintf(stderr, "[specula] kernels: %s\n", s.kernels.c_str());
            std::fprintf(stderr, "[specula] mode: %s\n", decoding_mode(args->engine).c_str());
            if (s.speculative) std::fprintf(stderr, "[specula] %s\n", format_summary(s.speculation).c_str());
            if (s.speculative && s.speculation.rounds > 0) std::fprintf(stderr, "[specula] %s\n", format_time_split(s).c_str());
            if (!s.early_exit.empty()) std::fprintf(stderr, "[specula] %s\n", s.early_exit.c_str());
            if (s.verify_cost_ms.size() >= 2) {
                // What the policies saw: a draft pays only if verifying it costs little more than one step.
                std::string costs;
                for (size_t n = 2; n <= std::min<size_t>(s.verify_cost_ms.size(), 8); ++n) {
                    char cell[32];
                    std::snprintf(cell, sizeof cell, "%s%zu: %.2fx", costs.empty() ? "" : ", ", n, s.verify_cost_ms[n - 1] / s.verify_cost_ms[0]);
                    costs += cell;
                }
                std::fprintf(stderr, "[specula] verify cost: 1 token %.2f ms; n tokens vs 1 token: %s\n", s.verify_cost_ms[0], costs.c_str());
            }
            return 0;
        };
    });
}

}  // namespace specula::cli
