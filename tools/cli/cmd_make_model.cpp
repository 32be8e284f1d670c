#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "commands.h"
#include "corpus_counts.h"
#include "specula/error.h"
#include "eagle3_vocab.h"
#include "model_writer.h"
#include "tokenizer/tokenizer.h"
#include "twin.h"

namespace specula::cli {

void register_make_model(CLI::App & app, Commands & commands) {
    struct Args {
        RandomModelSpec spec;
        std::string shape, vocab_dir, out;
    };
    auto args = std::make_shared<Args>();
    CLI::App * sub = app.add_subcommand(command::make_model.name, command::make_model.description);
    sub->add_option("-o,--output", args->out, "output GGUF path")->required();
    sub->add_option("--shape", args->shape, "named shape: llama-1b, smol-1b, smol-3b, smol-8b, llama-100m, tiny");
    sub->add_option("--vocab-dir", args->vocab_dir, "directory with llama.cpp's ggml-vocab-*.gguf")->default_val(SPECULA_VOCAB_DIR);
    sub->add_option("--vocab", args->spec.vocab_gguf, "vocabulary GGUF (overrides the shape's)");
    sub->add_option("--arch", args->spec.arch, "llama | qwen2 | qwen3 | gemma3");
    sub->add_option("--sliding-window", args->spec.sliding_window,
                    "gemma3: attention window of the sliding layers (5 of every 6; 0 = all global)");
    sub->add_option("--type", args->spec.weight_type, "matmul weight type: f32 f16 bf16 q8_0 q4_0 q4_k q6_k");
    sub->add_option("--seed", args->spec.seed, "weight seed");
    sub->callback([args, &commands] {
        commands.run = [args] {
            RandomModelSpec spec = bench_shape(args->shape.empty() ? "tiny" : args->shape, args->vocab_dir);
            if (!args->spec.vocab_gguf.empty()) spec.vocab_gguf = args->spec.vocab_gguf;
            spec.arch = args->spec.arch;
            spec.sliding_window = args->spec.sliding_window;
            spec.weight_type = args->spec.weight_type;
            spec.seed = args->spec.seed;
            write_random_model(spec, args->out);
            std::printf("wrote %s\n", args->out.c_str());
            return 0;
        };
    });

    struct TwinArgs {
        std::string target, shape = "llama-1b", type = "q8_0", out, eagle3, eagle3_out;
    };
    auto twin = std::make_shared<TwinArgs>();
    CLI::App * t = app.add_subcommand(command::make_twin.name, command::make_twin.description);
    t->add_option("--target", twin->target, "trained llama GGUF to embed")->required();
    t->add_option("--shape", twin->shape, "named shape: llama-1b (Llama-3.2-1B), smol-1b / smol-3b / smol-8b (1B / 3B / 8B widths, 30+ layers, head size 64: SmolLM2)")->capture_default_str();
    t->add_option("--type", twin->type, "matrix type: f32 f16 q8_0 q4_0 (Q4_K_M: llama-quantize a q8_0 twin)")->capture_default_str();
    t->add_option("-o,--output", twin->out, "output GGUF path")->required();
    t->add_option("--eagle3", twin->eagle3, "also rewrite this EAGLE-3 head of the target for the twin");
    t->add_option("--eagle3-output", twin->eagle3_out, "where to write the twin's EAGLE-3 head");
    t->callback([twin, &commands] {
        commands.run = [twin] {
            if (twin->eagle3.empty() != twin->eagle3_out.empty()) throw Error("--eagle3 and --eagle3-output go together");
            write_bench_twin(twin->target, twin->shape, twin->type, twin->out);
            if (!twin->eagle3.empty()) {
                write_bench_twin_eagle3(twin->eagle3, twin->target, twin->shape, twin->eagle3_out);
                std::printf("wrote %s (EAGLE-3 head for the twin)\n", twin->eagle3_out.c_str());
            }
            std::printf("wrote %s (bench twin of %s, %s shape)\n", twin->out.c_str(), twin->target.c_str(), twin->shape.c_str());
            return 0;
        };
    });

    struct CompactArgs {
        std::string head, target, out;
        std::vector<std::string> corpus;
        int keep = 2048;
        long long max_bytes = 64ll << 20;
    };
    auto compact = std::make_shared<CompactArgs>();
    CLI::App * c = app.add_subcommand(command::compact_eagle3.name, command::compact_eagle3.description);
    c->add_option("--head", compact->head, "EAGLE-3 head GGUF (full target vocabulary)")->required();
    c->add_option("--target", compact->target, "the target GGUF (its tokenizer counts the corpus)")->required();
    c->add_option("--corpus", compact->corpus, "text files or directories (read recursively; binary files skipped)")->required();
    c->add_option("--keep", compact->keep, "draft vocabulary size")->capture_default_str();
    c->add_option("--max-bytes", compact->max_bytes, "read at most this much of the corpus")->capture_default_str();
    c->add_option("-o,--output", compact->out, "output GGUF path")->required();
    c->callback([compact, &commands] {
        commands.run = [compact] {
            const Tokenizer tok(compact->target);
            const CorpusCounts c = count_corpus_tokens(tok, {compact->corpus, {}, {}, compact->max_bytes});
            const CompactVocabResult r = write_compact_eagle3(compact->head, c.counts, compact->keep, compact->out);
            std::printf("wrote %s: draft vocabulary %d of %d tokens, covering %.1f%% of %lld corpus bytes' tokens\n",
                        compact->out.c_str(), r.kept, tok.n_vocab(), 100.0 * r.coverage, static_cast<long long>(c.bytes));
            return 0;
        };
    });
}

}  // namespace specula::cli
