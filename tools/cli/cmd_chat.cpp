// `specula chat`: a conversation on stdin/stdout through the model's chat template. Each turn
// passes the whole conversation to Engine::generate, whose prefix cache keeps the K/V of the turns
// before, so a turn prefills only its own message.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "engine_flags.h"
#include "specula/specula.h"

namespace specula::cli {

namespace {
// One turn's figures on stderr: its speed and, speculating, the tokens each target forward gave.
void print_turn_summary(const GenerationStats & s) {
    std::fprintf(stderr, "[specula] prompt %d tok (%d cached), generated %d tok, %.1f tok/s", s.n_prompt, s.n_cached, s.n_generated,
                 s.generation_tok_s());
    if (s.speculative && s.speculation.rounds > 0) {
        std::fprintf(stderr, " | %.2f tokens per forward, %d of %d drafts accepted", s.speculation.mean_accepted_length(),
                     s.speculation.accepted, s.speculation.drafted);
    }
    std::fprintf(stderr, "\n");
}
}  // namespace

void register_chat(CLI::App & app, Commands & commands) {
    struct Args {
        EngineOptions engine;
        GenerationOptions gen;
        std::string system;
        bool no_spec = false;
    };
    auto args = std::make_shared<Args>();
    args->gen.n_predict = 512;
    CLI::App * sub = app.add_subcommand("chat", "chat with the model: a message a line on stdin, the replies streamed to stdout; /exit or EOF ends it");
    sub->add_option("-m,--model", args->engine.model_path,
                    "target model GGUF (default: SmolLM2-135M-Instruct from the model cache with its EAGLE-3 head, as generate)");
    sub->add_option("--system", args->system, "system message opening the conversation");
    sub->add_option("-n,--n-predict", args->gen.n_predict, "most tokens per reply")->capture_default_str();
    sub->add_option("-c,--ctx-size", args->engine.n_ctx, "context size in tokens (the whole conversation)")->capture_default_str();
    add_sampling_flags(sub, args->gen.sampling);
    add_engine_flags(sub, args->engine, args->no_spec);
    sub->callback([args, &commands] {
        commands.run = [args] {
            choose_model_and_drafter(args->engine, args->no_spec);
            auto engine = Engine::open(args->engine);
            std::vector<std::pair<std::string, std::string>> conversation;
            if (!args->system.empty()) conversation.emplace_back("system", args->system);
            std::string line;
            for (;;) {
                std::fputs("> ", stdout);
                std::fflush(stdout);
                if (!std::getline(std::cin, line) || line == "/exit") break;
                if (line.empty()) continue;
                conversation.emplace_back("user", line);
                std::string reply;
                const GenerationStats s = engine->generate(engine->tokenize_chat(conversation), args->gen, [&](int32_t token) {
                    const std::string piece = engine->piece(token);
                    reply += piece;
                    std::fputs(piece.c_str(), stdout);
                    std::fflush(stdout);
                    return true;
                });
                std::fputs("\n", stdout);
                std::fflush(stdout);
                print_turn_summary(s);
                conversation.emplace_back("assistant", reply);
            }
            std::fputs("\n", stdout);
            return 0;
        };
    });
}

}  // namespace specula::cli
