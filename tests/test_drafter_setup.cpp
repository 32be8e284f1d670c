// Drafter setups the engine refuses, each with an error naming the problem; the trimmed draft
// vocabularies (--draft-vocab N|FILE) and their file.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "specula/error.h"
#include "specula/specula.h"
#include "tokenizer/draft_vocabulary.h"
#include "engine/drafter_factory.h"
#include "runtime/model.h"
#include "tokenizer/tokenizer.h"
#include "test_models.h"

namespace specula {
namespace {

TEST(Speculative, BadSetupsGiveClearErrors) {
    auto message = [](const EngineOptions & o) {
        try {
            Engine::open(o);
        } catch (const Error & e) {
            return std::string(e.what());
        }
        return std::string("<no error>");
    };
    EngineOptions o;
    o.model_path = test::model_path("llama_gqa_f32");
    o.n_threads = 1;
    o.drafter = {DrafterKind::DraftModel, test::model_path("qwen2_bias")};
    EXPECT_NE(message(o).find("has a different vocabulary"), std::string::npos) << message(o);
    o.drafter = {DrafterKind::DraftModel, test::model_path("llama_draft_small")};
    o.n_ctx = 8;
    o.draft_max = 8;
    EXPECT_NE(message(o).find("does not fit the 8-token context"), std::string::npos) << message(o);
    o.n_ctx = 256;
    o.tree = TreeShape::Dynamic;
    o.drafter = {DrafterKind::Ngram};
    EXPECT_NE(message(o).find("the n-gram drafter drafts chains only"), std::string::npos) << message(o);
    o.tree.reset();
    o.drafter = {DrafterKind::Ngram, "", 3, 1};
    EXPECT_NE(message(o).find("n-gram sizes must satisfy 1 <= min <= max"), std::string::npos) << message(o);
}

// Catches a DrafterSpec whose kind and path disagree slipping through to a crash or a silent
// plain run: a file kind with no file, a file for a kind that takes none.
TEST(Speculative, DrafterSpecErrorsNameTheProblem) {
    auto message = [](DrafterSpec spec) {
        EngineOptions o;
        o.model_path = test::model_path("llama_gqa_f32");
        o.n_threads = 1;
        o.drafter = std::move(spec);
        return test::error_message([&] { Engine::open(o); });
    };
    EXPECT_EQ(message({DrafterKind::Eagle3}), "the eagle3 drafter needs a GGUF path");
    EXPECT_EQ(message({DrafterKind::Eagle}), "the eagle drafter needs a GGUF path");
    EXPECT_EQ(message({DrafterKind::DraftModel}), "the draft drafter needs a GGUF path");
    EXPECT_EQ(message({DrafterKind::Ngram, "x.gguf"}), "the ngram drafter takes no file, but was given x.gguf");
    EXPECT_EQ(message({DrafterKind::None, "x.gguf"}), "the none drafter takes no file, but was given x.gguf");
    EXPECT_EQ(message({DrafterKind::Ngram, "", 1, 3, true}),
              "prompt lookup (--lookup) grafts into a model drafter's trees: add --draft, --eagle or --eagle3 (--ngram drafts by lookup alone)");
    EXPECT_EQ(message({DrafterKind::None, "", 1, 3, true}),
              "prompt lookup (--lookup) grafts into a model drafter's trees: add --draft, --eagle or --eagle3");
    const std::string draft = test::model_path("llama_draft_small");
    EXPECT_EQ(message({DrafterKind::DraftModel, draft, 1, 3, false, -1}),
              "the draft vocabulary (--draft-vocab) must be 0 (all) or a token count, not -1");
    EXPECT_EQ(message({DrafterKind::Ngram, "", 1, 3, std::nullopt, 4096}),
              "a trimmed draft vocabulary (--draft-vocab) is for a draft model (--draft), not the ngram drafter");
    EXPECT_EQ(message({DrafterKind::Eagle3, "h.gguf", 1, 3, std::nullopt, 0, "v.txt"}),
              "a trimmed draft vocabulary (--draft-vocab) is for a draft model (--draft), not the eagle3 drafter");
    EXPECT_EQ(message({DrafterKind::DraftModel, draft, 1, 3, std::nullopt, 4096, "v.txt"}),
              "a trimmed draft vocabulary (--draft-vocab) is a token count or a file, not both (4096 and v.txt)");
    EXPECT_EQ(message({DrafterKind::Eagle3, "h.gguf", 1, 3, std::nullopt, 0, "", true}),
              "cascade drafting (--cascade, --no-cascade) is for a draft model's chains (--draft), not the eagle3 drafter");
    EXPECT_EQ(message({DrafterKind::Ngram, "", 1, 3, std::nullopt, 0, "", false}),
              "cascade drafting (--cascade, --no-cascade) is for a draft model's chains (--draft), not the ngram drafter");
    EngineOptions tree;
    tree.drafter.cascade = true;
    tree.tree = TreeShape::Dynamic;
    EXPECT_EQ(test::error_message([&] { drafting_rules(tree, DrafterKind::DraftModel); }),
              "cascade drafting (--cascade) drafts chains, not dynamic trees (--tree chain)");
}

// The trimmed draft vocabulary keeps the first N ids and every control and end-of-generation token
// (qwen2's sit at the end of its 151k ids); N at or past the vocabulary keeps the whole of it.
TEST(Speculative, ATrimmedDraftVocabularyKeepsTheFirstIdsAndTheControlTokens) {
    const std::string path = test::model_path("qwen2_bias");
    Backend backend(BackendOptions{"cpu", 1});
    auto target = Model::load(path, backend);
    const Tokenizer vocab(path);
    DrafterFactory f = DrafterFactory::open({DrafterKind::DraftModel, path, 1, 3, false, 1000}, backend, *target, vocab);
    const std::vector<int32_t> & ids = f.draft_logit_ids;
    ASSERT_GE(ids.size(), 1000u);
    for (int32_t t = 0; t < 1000; ++t) EXPECT_EQ(ids[t], t);
    std::vector<int32_t> specials = vocab.markup_tokens();
    specials.insert(specials.end(), vocab.end_of_generation_tokens().begin(), vocab.end_of_generation_tokens().end());
    ASSERT_FALSE(specials.empty());
    for (int32_t t : specials) EXPECT_NE(std::find(ids.begin(), ids.end(), t), ids.end()) << "control token " << t;
    EXPECT_EQ(ids.size(), 1000 + specials.size());
    EXPECT_TRUE(DrafterFactory::open({DrafterKind::DraftModel, path, 1, 3, false, target->config().n_vocab}, backend, *target, vocab)
                    .draft_logit_ids.empty());
}

std::string read_text(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

void write_text(const std::string & path, const std::string & text) { std::ofstream(path, std::ios::binary) << text; }

TEST(DraftVocabulary, TheMostFrequentIdsAreKeptTiesGoingToTheLowerId) {
    const std::vector<int64_t> counts = {5, 0, 7, 5, 9, 5};
    EXPECT_EQ(most_frequent_ids(counts, 3), (std::vector<int32_t>{0, 2, 4}));
    EXPECT_EQ(most_frequent_ids(counts, 4), (std::vector<int32_t>{0, 2, 3, 4}));
    EXPECT_EQ(most_frequent_ids(counts, 99), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
}

// A file's scattered ids come back as written (runs stored as "first-last"), and a draft model
// given the file keeps those ids and every control and end-of-generation token.
TEST(DraftVocabulary, AFileRoundTripsAndTheDraftModelKeepsItsIdsAndTheControlTokens) {
    const std::string path = test::model_path("qwen2_bias");
    Backend backend(BackendOptions{"cpu", 1});
    auto target = Model::load(path, backend);
    const Tokenizer vocab(path);
    const int V = vocab.n_vocab();
    std::vector<int32_t> ids;
    for (int32_t t = 0; t < 100; ++t) ids.push_back(t);
    for (int32_t t : {500, 501, 502, 7000, 20000, 20001, 20002, 20003, V - 300}) ids.push_back(t);
    const std::string file = test::scratch_file("vocab.txt");
    write_draft_vocabulary(file, ids, vocab, {"a test's ids"});
    EXPECT_EQ(read_draft_vocabulary(file, vocab), ids);
    const std::string text = read_text(file);
    EXPECT_EQ(text.rfind("specula-draft-vocab 1\ntokenizer ", 0), 0u) << text;
    EXPECT_NE(text.find("\n# a test's ids\nids 109\n0-99\n500-502\n7000\n20000-20003\n"), std::string::npos) << text;
    DrafterSpec spec{DrafterKind::DraftModel, path};
    spec.vocab_file = file;
    const DrafterFactory f = DrafterFactory::open(spec, backend, *target, vocab);
    EXPECT_EQ(f.draft_logit_ids, with_control_tokens(ids, vocab));
    EXPECT_TRUE(std::is_sorted(f.draft_logit_ids.begin(), f.draft_logit_ids.end()));
    for (const auto * specials : {&vocab.markup_tokens(), &vocab.end_of_generation_tokens()}) {
        for (int32_t t : *specials) EXPECT_TRUE(std::binary_search(f.draft_logit_ids.begin(), f.draft_logit_ids.end(), t)) << "control token " << t;
    }
}

// Catches a file of another vocabulary (or no such file) silently trimming the draft to the wrong
// ids: each is refused, naming the reason. The reasons are read_draft_vocabulary's, checked against
// the Qwen vocabulary loaded once; one refusal goes through Engine::open as `generate` and `serve`
// open it (a load of the Qwen vocabulary each time, seconds under the sanitizers).
TEST(DraftVocabulary, WrongFilesAreRefusedWithTheReason) {
    const std::string qwen = test::model_path("qwen2_bias"), llama = test::model_path("llama_gqa_f32");
    const Tokenizer qwen_vocab(qwen), llama_vocab(llama);
    auto message = [&](const std::string & file) {
        return test::error_message([&] { read_draft_vocabulary(file, qwen_vocab); });
    };
    const std::string other = test::scratch_file("llama-vocab.txt");
    write_draft_vocabulary(other, std::vector<int32_t>{1, 2, 3}, llama_vocab);
    const std::string opened = test::error_message([&] {
        EngineOptions o;
        o.model_path = qwen;
        o.n_threads = 1;
        o.drafter = {DrafterKind::DraftModel, qwen};
        o.drafter.vocab_file = other;
        Engine::open(o);
    });
    EXPECT_EQ(opened.rfind(other + " was made for another vocabulary (tokenizer ", 0), 0u) << opened;
    EXPECT_NE(opened.find("): make one with `specula draft-vocab -m MODEL.gguf`"), std::string::npos) << opened;
    EXPECT_EQ(message(other), opened);
    EXPECT_EQ(message(qwen), qwen + " is not a draft vocabulary file (its first line is not \"specula-draft-vocab 1\"; `specula draft-vocab` writes them)");
    EXPECT_EQ(message(other + ".absent"), other + ".absent: cannot read the draft vocabulary file");
    const std::string good = test::scratch_file("qwen-vocab.txt");
    write_draft_vocabulary(good, std::vector<int32_t>{1, 2, 3, 9}, qwen_vocab);
    const std::string header = read_text(good).substr(0, read_text(good).find("ids "));
    const std::string bad = test::scratch_file("bad-vocab.txt");
    auto with_body = [&](const std::string & body) {
        write_text(bad, header + body);
        return message(bad);
    };
    EXPECT_EQ(with_body("ids 4\n1-3\n9\n"), "<no error>");
    EXPECT_EQ(read_draft_vocabulary(bad, qwen_vocab), (std::vector<int32_t>{1, 2, 3, 9}));
    EXPECT_EQ(with_body("ids 5\n1-3\n9\n"), bad + ": 4 ids, not the header's 5 (a truncated file?)");
    EXPECT_EQ(with_body("ids 4\n1-3\n2\n"), bad + " line 5: ids must ascend without repeats (2 after 3)");
    EXPECT_EQ(with_body("ids 4\n1-3\nnine\n"), bad + " line 5: expected an id or a run \"<first>-<last>\", not \"nine\"");
    EXPECT_EQ(with_body("ids 4\n1-3\n999999\n"), bad + " line 5: \"999999\" is not a run of ids of the " + std::to_string(qwen_vocab.n_vocab()) +
                                                     "-token vocabulary");
    EXPECT_EQ(with_body("ids 2\n1-3\n"), bad + " line 4: more ids than the header's 2");
    write_text(bad, "specula-draft-vocab 2\n");
    EXPECT_EQ(message(bad), bad + ": draft vocabulary format \"specula-draft-vocab 2\", this specula reads version 1");
}

// `specula draft-vocab` counts a corpus's tokens (skipping a binary file) and writes the most
// frequent; `generate --draft-vocab FILE` drafts from them and prints plain decoding's text, and a
// file for another vocabulary is the CLI's one error line.
TEST(DraftVocabulary, TheCommandWritesTheMostFrequentTokensAndGenerateDraftsFromThem) {
    const std::string cli = SPECULA_CLI, target = test::shipped_model("specula-target.gguf"), draft = test::shipped_model("specula-draft.gguf");
    const std::string corpus = test::scratch_file("corpus");
    std::filesystem::create_directories(corpus + "/sub");
    write_text(corpus + "/a.py", "def f(x):\n    return x + 1\n\n\ndef g(y):\n    return f(y) * 2\n");
    write_text(corpus + "/sub/b.py", "for i in range(10):\n    print(f(i), g(i))\n");
    write_text(corpus + "/sub/c.pyc", std::string("\0\0binary def def def", 20));
    const std::string file = test::scratch_file("vocab.txt");
    const test::CommandRun made = test::run_command(cli + " draft-vocab -m " + target + " -n 8 -o " + file + " " + corpus);
    ASSERT_EQ(made.exit_code, 0) << made.err;
    EXPECT_NE(made.out.find("the 8 most frequent of "), std::string::npos) << made.out;
    EXPECT_NE(made.out.find("(2 files, "), std::string::npos) << "the binary file was counted: " << made.out;
    const Tokenizer vocab(target);
    const std::vector<int32_t> ids = read_draft_vocabulary(file, vocab);
    std::vector<int64_t> counts(static_cast<size_t>(vocab.n_vocab()));
    for (const std::string & text : {read_text(corpus + "/a.py"), read_text(corpus + "/sub/b.py")}) {
        for (int32_t t : vocab.tokenize(text, false, SpecialTokens::Text)) ++counts[static_cast<size_t>(t)];
    }
    EXPECT_EQ(ids, with_control_tokens(most_frequent_ids(counts, 8), vocab));

    auto generate = [&](const std::string & flags) {
        return cli + " generate -m " + target + " -p 'def f(x):' -n 32 -t 1 --temp 0 " + flags;
    };
    const test::CommandRun plain = test::run_command(generate("--no-spec"));
    const test::CommandRun trimmed = test::run_command(generate("--draft " + draft + " --draft-vocab " + file));
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    ASSERT_EQ(trimmed.exit_code, 0) << trimmed.err;
    EXPECT_EQ(trimmed.out, plain.out);
    EXPECT_NE(trimmed.err.find("logits over the vocabulary of " + file), std::string::npos) << trimmed.err;
    const std::string other = test::scratch_file("other-vocab.txt");
    write_draft_vocabulary(other, std::vector<int32_t>{1, 2}, Tokenizer(test::model_path("qwen2_bias")));
    test::expect_cli_error(cli, "generate -m " + target + " -p x -n 2 --draft " + draft + " --draft-vocab " + other,
                           other + " was made for another vocabulary");
    test::expect_cli_error(cli, "generate -m " + target + " -p x -n 2 --ngram --draft-vocab " + file,
                           "a trimmed draft vocabulary (--draft-vocab) is for a draft model (--draft), not the ngram drafter");
}

}  // namespace
}  // namespace specula
