// ggml's RPC backend as a specula device (`--device RPC[host:port]`): the way a model larger than
// one machine runs, and the proof that non-CPU devices keep ggml's kernels. The test starts
// llama.cpp's rpc-server on 127.0.0.1 itself.
#include <gtest/gtest.h>
#include <httplib.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <cmath>
#include <thread>

#include "specula/error.h"
#include "specula/specula.h"
#include "common/loopback.h"
#include "engine/model_bundle.h"
#include "runtime/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/kernels/matmul.h"
#include "runtime/model.h"
#include "server/http_server.h"
#include "server/scheduler.h"
#include "tokenizer/tokenizer.h"
#include "kv_compaction_check.h"
#include "test_models.h"

extern char ** environ;

namespace specula {
namespace {

// rpc-server on 127.0.0.1 with one thread, for the life of the test.
class RpcServer {
public:
    RpcServer() : port_(free_loopback_port()) {
        const std::string port = std::to_string(port_);
        const char * argv[] = {SPECULA_RPC_SERVER, "-H", "127.0.0.1", "-p", port.c_str(), "-t", "1", nullptr};
        if (posix_spawn(&pid_, SPECULA_RPC_SERVER, nullptr, nullptr, const_cast<char **>(argv), environ) != 0) pid_ = -1;
        for (int i = 0; i < 300 && pid_ > 0 && !accepts_connections("127.0.0.1", std::to_string(port_)); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ~RpcServer() {
        if (pid_ > 0) {
            kill(pid_, SIGCONT);  // a test may have frozen it
            kill(pid_, SIGTERM);
            waitpid(pid_, nullptr, 0);
        }
    }
    bool up() const { return pid_ > 0 && accepts_connections("127.0.0.1", std::to_string(port_)); }
    // Kills the server as a crash or a power cut would (no goodbye on the socket).
    void kill_now() {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
            pid_ = -1;
        }
    }
    // Freezes the server as a hung host would: the connection stays open, nothing answers.
    void freeze() { kill(pid_, SIGSTOP); }
    std::string device() const { return "RPC[127.0.0.1:" + std::to_string(port_) + "]"; }

private:
    int port_;
    pid_t pid_ = -1;
};

std::vector<float> logits(Backend & backend, const std::string & model_path, const std::vector<int32_t> & tokens) {
    auto model = Model::load(model_path, backend);
    ModelRunner runner(*model);
    KvCache cache(backend, model->config(), 64);
    std::vector<int32_t> rows(tokens.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i);
    // Two blocks: the second attends to a cache the first wrote on the device.
    const size_t half = tokens.size() / 2;
    ForwardOutput a = runner.forward(ForwardBatch::causal(std::span(tokens).first(half), 0, {rows.begin(), rows.begin() + half}), cache);
    ForwardOutput b = runner.forward(ForwardBatch::causal(std::span(tokens).subspan(half), static_cast<int>(half),
                                                          {rows.begin(), rows.begin() + (tokens.size() - half)}),
                                     cache);
    std::vector<float> out = a.logits;
    out.insert(out.end(), b.logits.begin(), b.logits.end());
    return out;
}

// A model on an rpc-server computes what the same ggml kernels compute locally (the server runs
// ggml's CPU backend): logits equal to the local run with --kernels ggml and the same attention
// kernel, for an F32 and a Q8_0 fixture (neither is repacked by ggml on x86, so both sides run the
// same code). A device that took specula's CPU kernels, or lost the KV written by the first block,
// fails this.
TEST(Rpc, ModelOnAnRpcServerGivesTheLocalGgmlLogits) {
    RpcServer server;
    ASSERT_TRUE(server.up()) << "rpc-server did not start: " << SPECULA_RPC_SERVER;
    const std::vector<int32_t> tokens = {1, 450, 4996, 17354, 1701, 338, 310, 526, 2253, 825, 29889, 3186};
    for (const char * name : {"llama_gqa_f32", "llama_q8_0"}) {
        SCOPED_TRACE(name);
        Backend rpc(BackendOptions{server.device(), 1});
        EXPECT_FALSE(rpc.own_kernels()) << "non-CPU devices keep ggml's matmul";
        EXPECT_EQ(rpc.attention_kernel(), AttentionKernel::Flash);
        Backend cpu(BackendOptions{"cpu", 1, Attention::Flash, Kernels::Ggml});
        const std::vector<float> remote = logits(rpc, test::model_path(name), tokens);
        const std::vector<float> local = logits(cpu, test::model_path(name), tokens);
        ASSERT_EQ(remote.size(), local.size());
        const double max_diff = test::max_abs_diff(remote, local);
        std::printf("[rpc] %-14s max |logit diff| RPC vs local ggml = %.3g\n", name, max_diff);
        EXPECT_LT(max_diff, 1e-4);
    }
}

// Tree compaction on a device moves the kept rows with copies the device runs (the host path reads
// a CPU buffer's memory directly and cannot serve a GPU or RPC buffer): the compacted cache must
// equal the path decoded alone, for both V layouts.
TEST(Rpc, TreeCompactionOnTheDeviceKeepsTheAcceptedPath) {
    RpcServer server;
    ASSERT_TRUE(server.up()) << "rpc-server did not start: " << SPECULA_RPC_SERVER;
    for (Attention attention : {Attention::Flash, Attention::Matmul}) {
        Backend rpc(BackendOptions{server.device(), 1, attention});
        const test::CompactionCheck c = test::check_tree_compaction(rpc, test::model_path("llama_q8_0"));
        SCOPED_TRACE(c.v_transposed ? "transposed V" : "row-major V");
        EXPECT_EQ(c.v_transposed, attention == Attention::Matmul);
        EXPECT_LT(c.max_kv_diff, 2e-3);
        EXPECT_LT(c.max_logit_diff, 1e-2);
    }
}

TEST(Rpc, SpeculasOwnKernelsAreRefusedOnAnRpcDevice) {
    const std::string msg = test::error_message([] { Backend b(BackendOptions{"RPC[127.0.0.1:1]", 1, Attention::Auto, Kernels::Specula}); });
    EXPECT_NE(msg.find("CPU only"), std::string::npos) << msg;
}

// ggml's RPC client aborts the process when nothing answers; specula must say so and go on living.
TEST(Rpc, NoServerOrAMalformedEndpointIsAClearError) {
    const std::string port = std::to_string(free_loopback_port());
    std::string msg = test::error_message([&] { Backend b(BackendOptions{"RPC[127.0.0.1:" + port + "]", 1}); });
    EXPECT_NE(msg.find("no rpc-server answers at 127.0.0.1:" + port), std::string::npos) << msg;
    msg = test::error_message([] { Backend b(BackendOptions{"RPC[localhost]", 1}); });
    EXPECT_NE(msg.find("expected RPC[host:port]"), std::string::npos) << msg;
}

// The layers of one model split over two rpc-servers (the embedding and output head stay on the
// local CPU) compute what the model on one rpc-server computes, bit for bit: the same ggml
// kernels run every op, only where the rows are differs. Also with the local CPU as one of the
// devices against the local CPU alone (ggml's kernels). A layer whose K/V went to the wrong
// device, or a block the scheduler copied wrongly between devices, fails this.
TEST(Rpc, SplitTargetGivesTheSingleDeviceLogitsBitForBit) {
    RpcServer a, b;
    ASSERT_TRUE(a.up() && b.up()) << "rpc-server did not start: " << SPECULA_RPC_SERVER;
    const std::vector<int32_t> tokens = {1, 450, 4996, 17354, 1701, 338, 310, 526, 2253, 825, 29889, 3186};
    for (const char * name : {"llama_gqa_f32", "llama_q8_0"}) {
        SCOPED_TRACE(name);
        Backend one(BackendOptions{a.device(), 1});
        Backend two(BackendOptions{a.device() + "," + b.device(), 1, Attention::Auto, Kernels::Auto, "1,1"});
        const std::vector<float> single = logits(one, test::model_path(name), tokens);
        const std::vector<float> split = logits(two, test::model_path(name), tokens);
        EXPECT_NE(two.kernels_summary().find("on " + b.device()), std::string::npos) << two.kernels_summary();
        EXPECT_EQ(test::max_abs_diff(single, split), 0.0) << "two rpc-servers vs one";

        Backend cpu(BackendOptions{"cpu", 1, Attention::Flash, Kernels::Ggml});
        Backend mixed(BackendOptions{"cpu," + b.device(), 1, Attention::Flash, Kernels::Ggml, "1,1"});
        const std::vector<float> local = logits(cpu, test::model_path(name), tokens);
        const std::vector<float> half = logits(mixed, test::model_path(name), tokens);
        EXPECT_NE(mixed.kernels_summary().find("ggml's on the local CPU"), std::string::npos) << mixed.kernels_summary();
        EXPECT_EQ(test::max_abs_diff(local, half), 0.0) << "local CPU + rpc-server vs local CPU";
    }
}

// With the local CPU in the list, its layers and the output head run specula's packed kernels and
// the rpc-server's layers ggml's, as the run summary says: the weights of the local layers (and
// the LM head) are repacked, the remote ones are not. Their logits differ from the same split on
// ggml's kernels only as the two kernel families round differently, and not at all without a
// local share of the layers.
TEST(Rpc, SplitRunsSpeculasKernelsOnTheLocalCpuAndGgmlsOnTheServer) {
    if (kernels::detected_cpu_path() == kernels::CpuPath::Generic) GTEST_SKIP() << "no SIMD path: auto keeps ggml's kernels";
    RpcServer a;
    ASSERT_TRUE(a.up()) << "rpc-server did not start: " << SPECULA_RPC_SERVER;
    const std::vector<int32_t> tokens = {1, 450, 4996, 17354, 1701, 338, 310, 526, 2253, 825, 29889, 3186};
    // F16 weights (the tied LM head packed as a copy): ggml's F16 matmul rounds the activations to
    // F16 where specula's keeps F32, a difference far below the int8 types' rounding noise.
    const std::string path = test::model_path("llama_tied_f16");
    Backend own(BackendOptions{"cpu," + a.device(), 1, Attention::Auto, Kernels::Auto, "1,1"});
    auto model = Model::load(path, own);
    ASSERT_EQ(model->config().n_layer, 2);
    for (int il = 0; il < 2; ++il) {
        const LayerWeights & L = model->weights().layers[il];
        SCOPED_TRACE("layer " + std::to_string(il));
        for (const ggml_tensor * w : {L.wq, L.wk, L.wv, L.wo, L.ffn_gate, L.ffn_up, L.ffn_down}) {
            EXPECT_EQ(kernels::packed_matrix_of(w) != nullptr, il == 0) << w->name;
        }
    }
    EXPECT_NE(kernels::packed_matrix_of(model->weights().output), nullptr) << "the LM head on the local CPU";
    EXPECT_EQ(own.kernels_summary(), std::string("specula's, ") + kernels::cpu_path_name(kernels::detected_cpu_path()) +
                                         " path on the local CPU (layer 0, output head); ggml's on " + a.device() +
                                         " (layer 1); attention: ggml's flash on every layer");
    model.reset();

    Backend ggml(BackendOptions{"cpu," + a.device(), 1, Attention::Auto, Kernels::Ggml, "1,1"});
    const std::vector<float> ours = logits(own, path, tokens);
    const std::vector<float> theirs = logits(ggml, path, tokens);
    EXPECT_EQ(ggml.kernels_summary().find("specula's"), std::string::npos) << ggml.kernels_summary();
    ASSERT_EQ(ours.size(), theirs.size());
    const double max_diff = test::max_abs_diff(ours, theirs);
    std::printf("[rpc] cpu + rpc-server: max |logit diff| specula's vs ggml's kernels on the local layers = %.3g\n", max_diff);
    EXPECT_GT(max_diff, 0.0) << "the local layers ran ggml's kernels";
    EXPECT_LT(max_diff, 3e-2) << "rounding differs; a layer computed wrongly moves logits by whole units";

    // The same list with no layers on the CPU: only the LM head is specula's.
    Backend remote_layers(BackendOptions{"cpu," + a.device(), 1, Attention::Auto, Kernels::Auto, "0,1"});
    auto head_only = Model::load(path, remote_layers);
    EXPECT_EQ(kernels::packed_matrix_of(head_only->weights().layers[0].wq), nullptr);
    EXPECT_NE(kernels::packed_matrix_of(head_only->weights().output), nullptr);
    EXPECT_NE(remote_layers.kernels_summary().find("on the local CPU (output head)"), std::string::npos) << remote_layers.kernels_summary();
}

// --kernels specula takes a list with the local CPU in it (its share runs specula's kernels), not
// one without; specula's attention stays a target on the local CPU alone (one V layout per cache).
TEST(Rpc, SpeculasKernelsNeedTheLocalCpuInTheListAndItsAttentionTheCpuAlone) {
    RpcServer a, b;
    ASSERT_TRUE(a.up() && b.up()) << "rpc-server did not start: " << SPECULA_RPC_SERVER;
    Backend with_cpu(BackendOptions{"cpu," + a.device(), 1, Attention::Auto, Kernels::Specula, "1,1"});
    EXPECT_TRUE(with_cpu.own_kernels());
    EXPECT_EQ(with_cpu.attention_kernel(), AttentionKernel::Flash);
    EXPECT_NE(with_cpu.kernels_summary().find("specula's"), std::string::npos) << with_cpu.kernels_summary();
    auto message = [](BackendOptions o) { return test::error_message([&] { Backend backend(o); }); };
    EXPECT_NE(message({a.device() + "," + b.device(), 1, Attention::Auto, Kernels::Specula, "1,1"}).find("has no cpu entry: take --kernels ggml"),
              std::string::npos);
    EXPECT_NE(message({"cpu," + a.device(), 1, Attention::Specula, Kernels::Auto, "1,1"})
                  .find("specula's attention runs for a target on the local CPU alone"),
              std::string::npos);
}

// Tree compaction with the cache's layers on two devices moves the kept rows on each of them.
TEST(Rpc, TreeCompactionWithASplitTargetKeepsTheAcceptedPath) {
    RpcServer a, b;
    ASSERT_TRUE(a.up() && b.up()) << "rpc-server did not start: " << SPECULA_RPC_SERVER;
    for (Attention attention : {Attention::Flash, Attention::Matmul}) {
        Backend split(BackendOptions{"cpu," + a.device() + "," + b.device(), 1, attention, Kernels::Auto, "1,1,1"});
        const test::CompactionCheck c = test::check_tree_compaction(split, test::model_path("llama_q8_0"));
        SCOPED_TRACE(c.v_transposed ? "transposed V" : "row-major V");
        EXPECT_LT(c.max_kv_diff, 2e-3);
        EXPECT_LT(c.max_logit_diff, 1e-2);
    }
}

std::vector<int32_t> greedy_tokens(const std::string & device, DrafterSpec drafter, std::optional<TreeShape> tree = std::nullopt,
                                   std::string * kernels = nullptr) {
    EngineOptions o;
    o.model_path = test::shipped_model("specula-target.gguf");
    o.device = device;
    o.split = "1,1";
    o.n_threads = 1;
    o.n_ctx = 256;
    o.drafter = std::move(drafter);
    o.tree = tree;
    auto engine = Engine::open(o);
    GenerationOptions g;
    g.n_predict = 40;
    g.stop_at_end_of_generation = false;
    std::vector<int32_t> out;
    const GenerationStats stats = engine->generate(engine->tokenize("Once upon a time"), g, [&](int32_t t) {
        out.push_back(t);
        return true;
    });
    if (kernels) *kernels = stats.kernels;
    return out;
}

// Greedy speculative decoding is lossless with the target split over two rpc-servers and the
// drafter on the local CPU: a draft model's chains and an EAGLE-3 head's trees (rollback and
// compaction of a cache on two devices) give plain decoding's tokens.
TEST(Rpc, GreedySpeculativeOutputEqualsPlainWithTheTargetSplit) {
    RpcServer a, b;
    ASSERT_TRUE(a.up() && b.up()) << "rpc-server did not start: " << SPECULA_RPC_SERVER;
    const std::string devices = a.device() + "," + b.device();
    const std::vector<int32_t> plain = greedy_tokens(devices, {});
    ASSERT_EQ(plain.size(), 40u);
    EXPECT_EQ(greedy_tokens(devices, {DrafterKind::DraftModel, test::shipped_model("specula-draft.gguf")}), plain);
    EXPECT_EQ(greedy_tokens(devices, {DrafterKind::Eagle3, test::shipped_model("specula-eagle3.gguf")}, TreeShape::Dynamic), plain);
}

// The same with the local CPU's layers on specula's kernels and the rpc-server's on ggml's.
TEST(Rpc, GreedySpeculativeOutputEqualsPlainWithTheLocalCpuOnSpeculasKernels) {
    if (kernels::detected_cpu_path() == kernels::CpuPath::Generic) GTEST_SKIP() << "no SIMD path: auto keeps ggml's kernels";
    RpcServer a;
    ASSERT_TRUE(a.up()) << "rpc-server did not start: " << SPECULA_RPC_SERVER;
    const std::string devices = "cpu," + a.device();
    std::string summary;
    const std::vector<int32_t> plain = greedy_tokens(devices, {}, std::nullopt, &summary);
    ASSERT_EQ(plain.size(), 40u);
    EXPECT_EQ(summary.rfind("specula's", 0), 0u) << summary;
    EXPECT_EQ(greedy_tokens(devices, {DrafterKind::DraftModel, test::shipped_model("specula-draft.gguf")}), plain);
    EXPECT_EQ(greedy_tokens(devices, {DrafterKind::Eagle3, test::shipped_model("specula-eagle3.gguf")}, TreeShape::Dynamic), plain);
}

// An rpc-server killed mid-generation ends the run with one error line, not a hang or ggml's
// backtrace (its RPC client aborts from its own thread: nothing unwinds to the caller).
TEST(RpcDeathTest, AServerKilledMidRunIsOneErrorLine) {
    RpcServer a, b;
    ASSERT_TRUE(a.up() && b.up()) << "rpc-server did not start: " << SPECULA_RPC_SERVER;
    auto generate_while_one_dies = [&] {
        Backend split(BackendOptions{a.device() + "," + b.device(), 1, Attention::Auto, Kernels::Auto, "1,1"});
        auto model = Model::load(test::model_path("llama_q8_0"), split);
        ModelRunner runner(*model);
        KvCache cache(split, model->config(), 64);
        const std::vector<int32_t> tokens = {1, 450, 4996};
        runner.forward(ForwardBatch::causal(tokens, 0, {2}), cache);
        b.kill_now();
        for (int i = 0; i < 8; ++i) runner.forward(ForwardBatch::causal(std::span(tokens).first(1), 3 + i, {0}), cache);
        std::exit(0);
    };
    EXPECT_EXIT(generate_while_one_dies(),
                testing::ExitedWithCode(1), "specula: error: an rpc-server stopped answering mid-generation");
}

// In a server, an rpc-server killed mid-generation fails the requests, not the process: the
// request in a slot ends with the error (a 5xx), a later one gets it at once, the health check
// reports it, and the process goes on serving. Catches a failure that still ends the process (the
// child dies with status 1 before the marker) or leaves a request waiting forever (a hang).
TEST(RpcDeathTest, AServerKilledMidServeFailsItsRequestsAndTheServerStaysUp) {
    RpcServer a, b;
    ASSERT_TRUE(a.up() && b.up()) << "rpc-server did not start: " << SPECULA_RPC_SERVER;
    auto serve_while_one_dies = [&] {
        EngineOptions o;
        o.model_path = test::shipped_model("specula-target.gguf");
        o.device = a.device() + "," + b.device();
        o.split = "1,1";
        o.n_ctx = 192;
        o.n_threads = 1;
        auto target = ModelBundle::open(o);
        Scheduler scheduler(*target, SchedulerOptions{2, 4, 16});
        GenerationOptions g;
        g.n_predict = 150;
        g.stop_at_end_of_generation = false;
        const std::vector<int32_t> prompt = target->tokenizer->tokenize("def main():\n    parser = argparse.");
        auto first = scheduler.submit(prompt, g);
        std::string text;
        while (text.empty()) {
            if (first->next(text) == Job::Wait::Ended) _Exit(2);  // ended before the kill
        }
        b.kill_now();
        while (first->next(text) != Job::Wait::Ended) {}
        if (first->result().error.find("rpc-server stopped answering") == std::string::npos) _Exit(3);
        auto later = scheduler.submit(prompt, g);
        while (later->next(text) != Job::Wait::Ended) {}
        if (later->result().error.empty() || scheduler.metrics().failure.empty() || !scheduler.failed()) _Exit(4);
        std::fprintf(stderr, "still serving\n");
        std::fflush(stderr);
        _Exit(0);  // as serve does: a target whose device failed is not torn down
    };
    EXPECT_EXIT(serve_while_one_dies(), testing::ExitedWithCode(0), "stopped answering mid-generation(.|\n)*still serving");
}

// A request that takes a slot saves the slot's earlier rows to the prefix store, over the network
// when the cache is on an rpc-server. A server frozen then fails the requests after --rpc-timeout
// and /health answers 503 naming the failure. Catches a slot's set-up that holds the scheduler's
// lock while it waits on the network: the watchdog's failure and /health then wait for it forever
// (the child's alarm ends the hang, and the test fails).
TEST(RpcDeathTest, AServerFrozenWhileASlotIsSetUpFailsTheRequestsAndHealthSays503) {
    RpcServer a;
    ASSERT_TRUE(a.up()) << "rpc-server did not start: " << SPECULA_RPC_SERVER;
    auto serve_while_it_freezes = [&] {
        alarm(60);  // a hang ends the child, not the test run
        EngineOptions o;
        o.model_path = test::shipped_model("specula-target.gguf");
        o.device = a.device();
        o.n_ctx = 128;
        o.n_threads = 1;
        o.rpc_timeout = 1.0;
        auto target = ModelBundle::open(o);
        Scheduler scheduler(*target, SchedulerOptions{1, 4, 16});
        HttpServer http(4, 1 << 16);
        const int port = http.start("127.0.0.1", 0);
        http.ready(*target, scheduler, {"target"});
        GenerationOptions g;
        g.n_predict = 4;
        g.stop_at_end_of_generation = false;
        std::string text;
        auto first = scheduler.submit(target->tokenizer->tokenize("def main():\n    parser = argparse."), g);
        while (first->next(text) != Job::Wait::Ended) {}
        if (!first->result().error.empty()) _Exit(2);
        a.freeze();
        // Another conversation: the slot's rows go to the prefix store first.
        auto second = scheduler.submit(target->tokenizer->tokenize("Once upon a time there was a"), g);
        while (second->next(text) != Job::Wait::Ended) {}
        if (second->result().error.find("did not answer within 1 s") == std::string::npos) _Exit(3);
        httplib::Client client("127.0.0.1", port);
        const httplib::Result health = client.Get("/health");
        if (!health || health->status != 503 || health->body.find("did not answer within") == std::string::npos) _Exit(4);
        std::fprintf(stderr, "health 503\n");
        std::fflush(stderr);
        _Exit(0);  // as serve does: a target whose device failed is not torn down
    };
    EXPECT_EXIT(serve_while_it_freezes(), testing::ExitedWithCode(0), "did not answer within 1 s(.|\n)*health 503");
}

// An rpc-server that stops answering without closing its connection (a frozen host) ends the run
// with one error line after --rpc-timeout, not a hang: ggml's client waits on the socket forever.
TEST(RpcDeathTest, AFrozenServerIsOneErrorLineAfterTheTimeout) {
    RpcServer a, b;
    ASSERT_TRUE(a.up() && b.up()) << "rpc-server did not start: " << SPECULA_RPC_SERVER;
    auto generate_while_one_freezes = [&] {
        Backend split(BackendOptions{a.device() + "," + b.device(), 1, Attention::Auto, Kernels::Auto, "1,1", 1.0});
        auto model = Model::load(test::model_path("llama_q8_0"), split);
        ModelRunner runner(*model);
        KvCache cache(split, model->config(), 64);
        const std::vector<int32_t> tokens = {1, 450, 4996};
        runner.forward(ForwardBatch::causal(tokens, 0, {2}), cache);
        b.freeze();
        runner.forward(ForwardBatch::causal(std::span(tokens).first(1), 3, {0}), cache);
        std::exit(0);
    };
    EXPECT_EXIT(generate_while_one_freezes(), testing::ExitedWithCode(1), "specula: error: an rpc-server did not answer within 1 s");
}

TEST(Rpc, DeviceListsAndSplitsThatDoNotFitAreClearErrors) {
    RpcServer a;
    ASSERT_TRUE(a.up()) << "rpc-server did not start: " << SPECULA_RPC_SERVER;
    auto message = [](BackendOptions o) { return test::error_message([&] { Backend b(o); }); };
    EXPECT_NE(message({"cpu," + a.device(), 1, Attention::Auto, Kernels::Auto, "1,2,3"}).find("--split has 3 entries for 2 devices"), std::string::npos);
    EXPECT_NE(message({"cpu," + a.device(), 1, Attention::Auto, Kernels::Auto, "1,x"}).find("'x' is not a non-negative number"), std::string::npos);
    EXPECT_NE(message({"cpu," + a.device(), 1, Attention::Auto, Kernels::Auto, "0,0"}).find("every share is zero"), std::string::npos);
    EXPECT_NE(message({a.device() + "," + a.device(), 1}).find("is listed twice"), std::string::npos);
    EXPECT_NE(message({"cpu,", 1}).find("an empty entry"), std::string::npos);
    EXPECT_NE(message({"cpu", 1, Attention::Auto, Kernels::Auto, "1"}).find("--split needs a list of devices"), std::string::npos);
    EXPECT_NE(message({a.device(), 1, Attention::Auto, Kernels::Auto, "", 0.0}).find("timeout must be positive"), std::string::npos);
    const std::string port = std::to_string(free_loopback_port());
    EXPECT_NE(message({a.device() + ",RPC[127.0.0.1:" + port + "]", 1}).find("no rpc-server answers at 127.0.0.1:" + port), std::string::npos);
    // A split backend holds one model's layer map.
    Backend split(BackendOptions{"cpu," + a.device(), 1, Attention::Auto, Kernels::Auto, "1,1"});
    auto model = Model::load(test::model_path("llama_q8_0"), split);
    EXPECT_NE(test::error_message([&] { split.place_layers(model->config().n_layer + 1); }).find("serves one model"), std::string::npos);
}

}  // namespace
}  // namespace specula
