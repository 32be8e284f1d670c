// `specula report`, `bench spec --html` and the live page of `specula serve`: each page rendered
// in a real browser (headless Chromium, installed by scripts/setup.sh --tests), checked through the DOM it builds.
#include <gtest/gtest.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <cerrno>
#include <cstring>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "specula/specula.h"
#include "trace/trace.h"
#include "runtime/backend.h"
#include "runtime/model.h"
#include "specee_predictor.h"
#include "test_models.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string & path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

std::string artifacts_dir() {
    const std::string dir = std::string(SPECULA_TEST_DIR) + "/test-artifacts/report";
    fs::create_directories(dir);
    return dir;
}

std::string chromium() {
    for (const char * name : {"chromium", "chromium-browser"}) {
        if (test::run_command(std::string("command -v ") + name).exit_code == 0) return name;
    }
    return "";
}

// The directory a browser takes for TMPDIR, removed with everything in it: Chromium keeps its
// profile's singleton socket in a directory of its own under TMPDIR, which it leaves behind when
// it is killed, and the profile directories are too long a path for a socket.
struct BrowserTmp {
    std::string path;
    BrowserTmp() {
        std::string pattern = (fs::temp_directory_path() / "specula-chromium-XXXXXX").string();
        EXPECT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
        path = pattern;
    }
    ~BrowserTmp() {
        std::error_code gone;  // the browser's child processes may still be deleting their files
        fs::remove_all(path, gone);
    }
    BrowserTmp(const BrowserTmp &) = delete;
    BrowserTmp & operator=(const BrowserTmp &) = delete;
};

// The DOM after the page's scripts ran, and a screenshot kept beside it.
std::string render(const std::string & browser, const std::string & html, const std::string & screenshot) {
    // One profile per test process (ctest -j runs several browsers at once), removed afterwards.
    const std::string profile = artifacts_dir() + "/chromium-profile-" + std::to_string(::getpid());
    const std::string flags =
        " --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions --hide-scrollbars"
        " --user-data-dir=" +
        profile;
    const std::string url = "file://" + fs::absolute(html).string();
    const BrowserTmp tmp;
    const std::string run = "TMPDIR=" + tmp.path + " timeout 120 " + browser + flags;
    const test::CommandRun dom = test::run_command(run + " --dump-dom " + url);
    EXPECT_EQ(dom.exit_code, 0) << dom.err;
    const test::CommandRun shot = test::run_command(run + " --window-size=1500,2600 --screenshot=" + screenshot + " " + url);
    EXPECT_EQ(shot.exit_code, 0) << shot.err;
    EXPECT_TRUE(fs::exists(screenshot)) << shot.err;
    std::ofstream(fs::path(screenshot).replace_extension(".dom.html")) << dom.out;
    fs::remove_all(profile);
    return dom.out;
}

size_t count(const std::string & s, const std::string & what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
    return n;
}

// Speculative runs on the bundled models with traces: a sampled chain (accepted, corrections,
// bonus tokens) and a 10-node dynamic tree.
std::vector<std::string> make_traces() {
    const std::string models = test::shipped_model("");
    std::vector<std::string> paths;
    for (const bool tree : {false, true}) {
        EngineOptions eo;
        eo.model_path = models + "specula-target.gguf";
        eo.drafter = {DrafterKind::DraftModel, models + "specula-draft.gguf"};
        eo.n_threads = 1;
        eo.n_ctx = 256;
        eo.draft_max = 4;
        eo.draft_policy = DraftPolicyKind::Fixed;
        if (tree) {
            eo.tree = TreeShape::Dynamic;
            eo.tree_nodes = 10;  // fixed: the size policy may verify single nodes on a slow machine, and the page must show branches
        }
        GenerationOptions go;
        go.n_predict = 48;
        go.stop_at_end_of_generation = false;
        go.sampling.temperature = tree ? 0.0f : 0.8f;
        go.sampling.seed = 7;
        paths.push_back(artifacts_dir() + (tree ? "/tree.jsonl" : "/chain.jsonl"));
        auto engine = Engine::open(eo);
        TraceWriter trace(paths.back(), [&](int32_t t) { return engine->piece(t); });
        go.on_round = [&](const RoundReport & round) { trace.round(round); };
        engine->generate("def main():\n    parser = argparse.", go, [](const std::string &) { return true; });
    }
    return paths;
}

struct TraceFacts {
    std::vector<std::pair<std::string, int>> emitted;  // outcome, token, in order
    int rounds = 0, max_depth = 0;
    int biggest_tree = 0, biggest_accepted = 0;  // the round the page shows first: the first with most nodes
};

TraceFacts facts_of(const std::string & path) {
    TraceFacts f;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line);
        if (j["kind"] == "round") {
            ++f.rounds;
            const auto depths = j["tree"]["depth"].get<std::vector<int>>();
            for (int d : depths) f.max_depth = std::max(f.max_depth, d);
            if (static_cast<int>(depths.size()) > f.biggest_tree || f.rounds == 1) {
                f.biggest_tree = static_cast<int>(depths.size());
                f.biggest_accepted = static_cast<int>(j["accepted"].size());
            }
        } else if (j["outcome"] != "rejected") {
            f.emitted.emplace_back(j["outcome"], j["token"]);
        }
    }
    return f;
}

// Catches a page that drops, duplicates, reorders or mis-classes tokens, draws the wrong number
// of bars, lines or tree nodes, or throws a script error anywhere while building (the page's
// window.onerror writes #js-error; #report-ready is written only after everything rendered).
TEST(Report, TraceReportRendersInChromiumWithEveryTokenAndChart) {
    const auto traces = make_traces();
    const std::string html = artifacts_dir() + "/report.html";
    const test::CommandRun made = test::run_command(std::string(SPECULA_CLI) + " report " + traces[0] + " " + traces[1] + " -o " + html);
    ASSERT_EQ(made.exit_code, 0) << made.err;
    const std::string page = slurp(html);
    for (const char * fetches : {"src=", "href=", "<link", "@import", "url(", "fetch(", "XMLHttpRequest"}) {
        EXPECT_EQ(page.find(fetches), std::string::npos) << "the page must not load anything: " << fetches;
    }

    const std::string browser = chromium();
    if (browser.empty()) GTEST_SKIP() << "chromium is not installed (scripts/setup.sh --tests installs it): the page was written but not rendered";
    const std::string dom = render(browser, html, artifacts_dir() + "/report.png");
    std::printf("[report] screenshot: %s/report.png\n", artifacts_dir().c_str());
    EXPECT_EQ(dom.find("id=\"js-error\""), std::string::npos) << dom.substr(dom.find("js-error"), 300);
    ASSERT_NE(dom.find("id=\"report-ready\""), std::string::npos) << "the page's script did not finish";

    const std::string marker = "<section class=\"run\" id=\"run-";
    ASSERT_EQ(count(dom, marker), traces.size());
    for (size_t i = 0; i < traces.size(); ++i) {
        const size_t from = dom.find(marker + std::to_string(i));
        const size_t to = i + 1 < traces.size() ? dom.find(marker + std::to_string(i + 1)) : dom.size();
        const std::string run = dom.substr(from, to - from);
        const TraceFacts f = facts_of(traces[i]);
        SCOPED_TRACE(traces[i]);

        std::vector<std::pair<std::string, int>> shown;
        const std::regex token_span("<span class=\"tok (accepted|correction|bonus)\" data-token=\"(\\d+)\"");
        for (auto it = std::sregex_iterator(run.begin(), run.end(), token_span); it != std::sregex_iterator(); ++it) {
            shown.emplace_back((*it)[1].str(), std::stoi((*it)[2].str()));
        }
        EXPECT_EQ(shown, f.emitted);
        EXPECT_GT(f.emitted.size(), 40u);

        EXPECT_EQ(count(run, "class=\"bar-pos\""), static_cast<size_t>(f.max_depth));
        EXPECT_EQ(count(run, "class=\"bar-hist\""), static_cast<size_t>(f.max_depth + 1));
        EXPECT_EQ(count(run, "class=\"bar-draft\""), static_cast<size_t>(f.rounds));
        EXPECT_EQ(count(run, "class=\"bar-verify\""), static_cast<size_t>(f.rounds));
        for (const char * line : {"line-emitted", "line-rolling", "line-size"}) EXPECT_EQ(count(run, std::string("class=\"") + line + "\""), 1u) << line;
        EXPECT_EQ(count(run, "<g class=\"tree-node"), static_cast<size_t>(f.biggest_tree));
        EXPECT_EQ(count(run, "<g class=\"tree-node on-path"), static_cast<size_t>(f.biggest_accepted));
        EXPECT_EQ(count(run, "<g class=\"tree-root\""), 1u);
        EXPECT_EQ(count(run, "<g class=\"tree-next"), 1u);
        EXPECT_EQ(count(run, "<option "), static_cast<size_t>(f.rounds));
    }
    EXPECT_GT(facts_of(traces[1]).biggest_tree, facts_of(traces[1]).max_depth) << "the tree run drafted no branching tree";
}

// Catches a bench page that loses result rows or a chart: one tok/s bar and one whisker per
// result, one point per predicted result, one acceptance line per mode and temperature.
TEST(Report, BenchPageRendersInChromiumWithItsCharts) {
    const std::string json_path = std::string(SPECULA_SOURCE_DIR) + "/tests/fixtures/bench-spec-bundled.json";
    const std::string html = artifacts_dir() + "/bench.html";
    const test::CommandRun made = test::run_command(std::string(SPECULA_CLI) + " report --bench " + json_path + " -o " + html);
    ASSERT_EQ(made.exit_code, 0) << made.err;
    const std::string browser = chromium();
    if (browser.empty()) GTEST_SKIP() << "chromium is not installed (scripts/setup.sh --tests installs it): the page was written but not rendered";
    const std::string dom = render(browser, html, artifacts_dir() + "/bench.png");
    EXPECT_EQ(dom.find("id=\"js-error\""), std::string::npos) << dom.substr(dom.find("js-error"), 300);
    ASSERT_NE(dom.find("id=\"report-ready\""), std::string::npos);

    const auto bench = nlohmann::json::parse(slurp(json_path));
    size_t results = 0, predicted = 0, beside_llama = 0;
    std::set<std::pair<double, std::string>> modes_with_positions, llama_plain;  // (temperature, mode / category)
    for (const auto & r : bench["results"]) {
        if (r["mode"] == bench["llamacpp_plain_mode"]) llama_plain.insert({r["temperature"].get<double>(), r["category"].get<std::string>()});
    }
    for (const auto & r : bench["results"]) {
        ++results;
        beside_llama += llama_plain.count({r["temperature"].get<double>(), r["category"].get<std::string>()});
        predicted += r.value("predicted_speedup", 0.0) > 0;
        if (r.contains("acceptance_by_position") && !r["acceptance_by_position"].empty()) {
            modes_with_positions.insert({r["temperature"].get<double>(), r["mode"].get<std::string>()});
        }
    }
    EXPECT_EQ(count(dom, "class=\"whisker\""), results);
    // tok/s and speedup vs specula plain for every row, speedup vs llama.cpp where it ran plain
    EXPECT_EQ(count(dom, "class=\"bench-bar\""), 2 * results + beside_llama);
    EXPECT_GT(beside_llama, 0u);
    EXPECT_EQ(count(dom, "class=\"pred-point\""), predicted);
    EXPECT_GT(predicted, 0u);
    EXPECT_EQ(count(dom, "class=\"acc-line\""), modes_with_positions.size());
}

// Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: the
// browser reads commands on fd 3 and writes replies and events on fd 4, each JSON ending in NUL),
// for a page that must be waited on (a stream) rather than dumped at its load event.
class Devtools {
public:
    explicit Devtools(const std::string & browser) {
        int to[2], from[2];
        EXPECT_EQ(pipe(to), 0);
        EXPECT_EQ(pipe(from), 0);
        const std::string profile = "--user-data-dir=" + profile_dir_;
        const std::string tmpdir = "TMPDIR=" + tmp_.path;
        pid_ = fork();
        if (pid_ == 0) {
            dup2(to[0], 3);
            dup2(from[1], 4);
            const int devnull = ::open("/dev/null", O_WRONLY);
            dup2(devnull, 1);
            dup2(devnull, 2);
            execlp("env", "env", tmpdir.c_str(), browser.c_str(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
                   "--hide-scrollbars", "--remote-debugging-pipe", profile.c_str(), "about:blank", static_cast<char *>(nullptr));
            _exit(127);
        }
        close(to[0]);
        close(from[1]);
        out_ = to[1];
        in_ = from[0];
    }
    ~Devtools() {
        close(out_);
        close(in_);
        kill(pid_, SIGTERM);
        waitpid(pid_, nullptr, 0);
        // The browser's child processes may still be deleting files of the profile: what they
        // remove first is no error.
        std::error_code gone;
        fs::remove_all(profile_dir_, gone);
    }
    // A command's result (events read meanwhile are kept in errors() when they report an error).
    nlohmann::json call(const std::string & method, const nlohmann::json & params = nlohmann::json::object()) {
        const int id = ++next_id_;
        nlohmann::json msg{{"id", id}, {"method", method}, {"params", params}};
        if (!session_.empty()) msg["sessionId"] = session_;
        std::string text = msg.dump();
        text.push_back('\0');
        for (size_t at = 0; at < text.size();) {
            const ssize_t n = write(out_, text.data() + at, text.size() - at);
            if (n <= 0) throw std::runtime_error("the browser closed its DevTools pipe");
            at += static_cast<size_t>(n);
        }
        for (;;) {
            const nlohmann::json reply = read_message();
            if (reply.contains("id") && reply["id"] == id) {
                if (reply.contains("error")) throw std::runtime_error(method + ": " + reply["error"].dump());
                return reply["result"];
            }
            const std::string event = reply.value("method", "");
            if (event == "Runtime.exceptionThrown" || (event == "Runtime.consoleAPICalled" && reply["params"]["type"] == "error")) {
                errors_.push_back(reply["params"].dump());
            }
        }
    }
    // Opens `url` in a new tab; later calls go to that tab.
    void open(const std::string & url) {
        const std::string target = call("Target.createTarget", {{"url", "about:blank"}})["targetId"];
        session_ = call("Target.attachToTarget", {{"targetId", target}, {"flatten", true}})["sessionId"];
        call("Runtime.enable");
        call("Emulation.setDeviceMetricsOverride", {{"width", 1400}, {"height", 1000}, {"deviceScaleFactor", 1}, {"mobile", false}});
        call("Page.navigate", {{"url", url}});
    }
    nlohmann::json evaluate(const std::string & expression) {
        return call("Runtime.evaluate", {{"expression", expression}, {"returnByValue", true}})["result"]["value"];
    }
    void screenshot(const std::string & path) {
        const std::string b64 = call("Page.captureScreenshot", {{"format", "png"}})["data"];
        std::string png;
        int bits = 0, value = 0;
        for (char c : b64) {
            const char * digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            const char * at = std::strchr(digits, c);
            if (c == '=' || !at) continue;
            value = value << 6 | static_cast<int>(at - digits);
            bits += 6;
            if (bits >= 8) png.push_back(static_cast<char>((value >> (bits -= 8)) & 0xff));
        }
        std::ofstream(path, std::ios::binary) << png;
    }
    const std::vector<std::string> & errors() const { return errors_; }

private:
    // One profile per browser: a test's browser may still be exiting when the next one starts.
    inline static int browsers_ = 0;
    const std::string profile_dir_ = artifacts_dir() + "/chromium-profile-devtools-" + std::to_string(::getpid()) + "-" + std::to_string(browsers_++);
    const BrowserTmp tmp_;  // removed after the destructor's body has stopped the browser
    nlohmann::json read_message() {
        for (;;) {
            const size_t end = buffer_.find('\0');
            if (end != std::string::npos) {
                const std::string text = buffer_.substr(0, end);
                buffer_.erase(0, end + 1);
                return nlohmann::json::parse(text);
            }
            pollfd p{in_, POLLIN, 0};
            if (poll(&p, 1, 120000) <= 0) throw std::runtime_error("the browser did not answer within 120 s");
            char chunk[65536];
            const ssize_t n = read(in_, chunk, sizeof(chunk));
            if (n <= 0) throw std::runtime_error("the browser closed its DevTools pipe");
            buffer_.append(chunk, static_cast<size_t>(n));
        }
    }
    pid_t pid_ = -1;
    int out_ = -1, in_ = -1, next_id_ = 0;
    std::string session_, buffer_;
    std::vector<std::string> errors_;
};

// `specula serve` on the bundled models in the background with `flags`, stopped when this goes
// out of scope.
struct Server {
    std::string dir, pid;
    int port = 0;
    // Its files (serve.err, the port's source) in a folder of the running test's own: the tests
    // that start servers run at once under ctest -j.
    explicit Server(const std::string & flags = "")
        : dir(artifacts_dir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name()) {
        fs::create_directories(dir);
        const std::string models = test::shipped_model("");
        const std::string cmd = std::string(SPECULA_CLI) + " serve -m " + models + "specula-target.gguf --draft " + models +
                                "specula-draft.gguf --draft-policy fixed --draft-max 4 -c 256 -t 1 --port 0 " + flags;
        // A previous run's serve.err names its port: the background shell may truncate the file
        // only after the loop below first reads it, so it must not exist beforehand.
        std::filesystem::remove(dir + "/serve.err");
        EXPECT_EQ(std::system((cmd + " >" + dir + "/serve.out 2>" + dir + "/serve.err & echo $! >" + dir + "/serve.pid").c_str()), 0);
        pid = slurp(dir + "/serve.pid");
        const std::regex ready("listening on http://127\\.0\\.0\\.1:(\\d+)[\\s\\S]*specula: ready");
        for (int i = 0; i < 600 && port == 0; ++i) {
            std::smatch m;
            const std::string err = slurp(dir + "/serve.err");
            if (std::regex_search(err, m, ready)) port = std::stoi(m[1].str());
            else std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    }
    ~Server() { std::system(("kill " + pid).c_str()); }
    std::string url(const std::string & path) const { return "http://127.0.0.1:" + std::to_string(port) + path; }
};

std::string html_text(std::string s) {
    for (const auto & [entity, c] : std::vector<std::pair<std::string, std::string>>{{"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&nbsp;", "\xc2\xa0"}, {"&amp;", "&"}}) {
        for (size_t at = s.find(entity); at != std::string::npos; at = s.find(entity, at + c.size())) s.replace(at, entity.size(), c);
    }
    return s;
}

// Catches a live page that loses, duplicates or reorders streamed tokens, leaves one without its
// colour class, shows no live figures, loads anything from elsewhere, or throws a script error;
// and a stream whose per-token "specula" field disagrees with its text: the browser sends the
// prompt through the page (?prompt=), and the coloured text must equal the server's non-streamed
// completion of the same prompt at T=0.
TEST(Report, LivePageOnTheServerStreamsColouredTokens) {
    const Server server;
    ASSERT_GT(server.port, 0) << slurp(server.dir + "/serve.err");
    const test::CommandRun page = test::run_command("curl -sf " + server.url("/"));
    ASSERT_EQ(page.exit_code, 0);
    for (const char * fetches : {"src=", "href=", "<link", "@import", "url(", "http://", "https://"}) {
        EXPECT_EQ(page.out.find(fetches), std::string::npos) << "the page must load nothing from elsewhere: " << fetches;
    }
    const std::string prompt = "Write a Python function";
    const std::string body = nlohmann::json{{"messages", nlohmann::json::array({{{"role", "user"}, {"content", prompt}}})}, {"temperature", 0}, {"max_tokens", 128}}.dump();
    std::ofstream(server.dir + "/live-request.json") << body;
    const test::CommandRun plain = test::run_command("curl -sf -H 'Content-Type: application/json' --data @" + server.dir +
                                                     "/live-request.json " + server.url("/v1/chat/completions"));
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const std::string want = nlohmann::json::parse(plain.out)["choices"][0]["message"]["content"];
    ASSERT_FALSE(want.empty());

    const std::string browser = chromium();
    if (browser.empty()) GTEST_SKIP() << "chromium is not installed (scripts/setup.sh --tests installs it)";
    Devtools chrome(browser);
    chrome.open(server.url("/?prompt=Write%20a%20Python%20function"));
    for (int i = 0; i < 1200 && !chrome.evaluate("document.querySelector('.reply[data-done]') !== null").get<bool>(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const std::string dom = chrome.evaluate("document.documentElement.outerHTML");
    std::ofstream(artifacts_dir() + "/live.dom.html") << dom;
    chrome.screenshot(artifacts_dir() + "/live.png");
    std::printf("[report] screenshot: %s/live.png\n", artifacts_dir().c_str());
    EXPECT_TRUE(chrome.errors().empty()) << chrome.errors().front();
    EXPECT_EQ(dom.find("id=\"js-error\""), std::string::npos) << dom.substr(dom.find("js-error"), 300);
    const size_t replies = dom.find("id=\"replies\"");
    ASSERT_NE(replies, std::string::npos);
    const std::string reply = dom.substr(replies, dom.find("<form", replies) - replies);
    ASSERT_NE(reply.find("data-done=\"1\""), std::string::npos) << "the reply did not finish: " << reply.substr(0, 500);

    const std::regex token_span("<span class=\"tok (accepted|bonus|correction)\" data-depth=\"(\\d+)\"[^>]*>([^<]*)</span>");
    std::string shown;
    std::set<std::string> kinds;
    size_t spans = 0;
    for (auto it = std::sregex_iterator(reply.begin(), reply.end(), token_span); it != std::sregex_iterator(); ++it, ++spans) {
        kinds.insert((*it)[1].str());
        shown += html_text((*it)[3].str());
    }
    EXPECT_EQ(shown, want);
    EXPECT_EQ(spans, count(reply, "<span")) << "a token without its class";
    EXPECT_TRUE(kinds.count("accepted") && kinds.count("bonus") + kinds.count("correction")) << "the colours tell no drafts from target tokens";

    const auto figure = [&](const std::string & id) {
        std::smatch m;
        const std::regex cell("id=\"" + id + "\">([^<]*)<");
        return std::regex_search(dom, m, cell) ? m[1].str() : std::string("<missing>");
    };
    EXPECT_TRUE(std::regex_match(figure("fig-slots"), std::regex("[01] / 1"))) << figure("fig-slots");
    for (const char * number : {"fig-acceptance", "fig-mean-accepted", "fig-reply-tok-s"}) {
        EXPECT_TRUE(std::regex_match(figure(number), std::regex("[0-9]+\\.[0-9]+"))) << number << ": " << figure(number);
    }
}

// Catches a live page that stops working on a server started with --api-key: its data requests get
// 401, so it must ask for the key, send it as a bearer token (the server checks it: without it no
// figure and no reply) and ask again when the server refuses the key.
TEST(Report, LivePageAsksForTheApiKeyAndSendsItAsABearerToken) {
    const Server server("--api-key sk-live-page");
    ASSERT_GT(server.port, 0) << slurp(server.dir + "/serve.err");
    const std::string browser = chromium();
    if (browser.empty()) GTEST_SKIP() << "chromium is not installed (scripts/setup.sh --tests installs it)";
    Devtools chrome(browser);
    chrome.open(server.url("/?prompt=Write%20a%20Python%20function"));
    // Until `condition` holds on the page (false while the page is still loading: its elements are absent).
    const auto wait_for = [&](const std::string & condition) {
        const std::string guarded = "(() => { try { return !!(" + condition + "); } catch (e) { return false; } })()";
        for (int i = 0; i < 1200 && !chrome.evaluate(guarded).get<bool>(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        return chrome.evaluate(guarded).get<bool>();
    };
    const auto enter_key = [&](const std::string & key) {
        chrome.evaluate("document.getElementById('api-key').value = '" + key + "'; document.getElementById('key-form').requestSubmit(); true");
    };
    ASSERT_TRUE(wait_for("!document.getElementById('key-form').hidden")) << "the page did not ask for the key";
    chrome.screenshot(artifacts_dir() + "/live-key-asked.png");
    EXPECT_EQ(chrome.evaluate("document.getElementById('fig-slots').textContent").get<std::string>(), "-");
    EXPECT_EQ(chrome.evaluate("document.querySelectorAll('.reply .tok').length").get<int>(), 0);
    enter_key("sk-wrong");
    ASSERT_TRUE(wait_for("!document.getElementById('key-form').hidden && document.getElementById('key-note').textContent.includes('refused')"))
        << "a refused key was not asked again";
    enter_key("sk-live-page");
    ASSERT_TRUE(wait_for("document.querySelector('.reply[data-done]') !== null"));
    const std::string dom = chrome.evaluate("document.documentElement.outerHTML");
    std::ofstream(artifacts_dir() + "/live-key.dom.html") << dom;
    chrome.screenshot(artifacts_dir() + "/live-key.png");
    EXPECT_TRUE(chrome.errors().empty()) << chrome.errors().front();
    EXPECT_EQ(dom.find("id=\"js-error\""), std::string::npos) << dom.substr(dom.find("js-error"), 300);
    EXPECT_GT(chrome.evaluate("document.querySelectorAll('.reply .tok').length").get<int>(), 0);
    EXPECT_NE(chrome.evaluate("document.querySelector('.reply').getAttribute('data-finish')").get<std::string>(), "") << "the stream did not finish";
    EXPECT_TRUE(chrome.evaluate("document.getElementById('key-form').hidden").get<bool>());
    EXPECT_TRUE(std::regex_match(chrome.evaluate("document.getElementById('fig-slots').textContent").get<std::string>(), std::regex("[01] / 1")));
    EXPECT_EQ(chrome.evaluate("sessionStorage.getItem('specula-api-key')").get<std::string>(), "sk-live-page");
}

// Catches a report command that crashes or writes a page from input that is not a trace.
// SpecEE runs of a fixture Gemma 3 target (3 layers) with a random EAGLE-3 head and a predictor
// at layer 2 whose probability is 0.5: threshold 0.4 exits every token there, 0.6 none.
EngineOptions specee_engine(float threshold, bool lossless) {
    EngineOptions eo;
    eo.model_path = test::model_path("gemma3_swa_q8_0");
    eo.n_threads = 1;
    eo.n_ctx = 128;
    auto backend = std::make_unique<Backend>(BackendOptions{});
    auto model = Model::load(eo.model_path, *backend);
    test::PredictorSpec spec;
    spec.layers = {2};
    eo.specee_path = test::write_predictor(spec, *model, "report_half_" + std::to_string(::getpid()));
    eo.drafter = {DrafterKind::Eagle3, test::eagle_head_path("eagle3", "gemma3_swa_q8_0")};
    eo.draft_policy = DraftPolicyKind::Fixed;
    eo.draft_max = 3;
    eo.specee_threshold = threshold;
    eo.specee_lossless = lossless;
    return eo;
}

std::vector<nlohmann::json> trace_lines(const std::string & path, const std::string & kind) {
    std::vector<nlohmann::json> lines;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
        auto j = nlohmann::json::parse(line);
        if (j.value("kind", "token") == kind) lines.push_back(std::move(j));
    }
    return lines;
}

// Catches: a SpecEE trace without each token's exit layer (lossy: one exit line per token;
// lossless: each drafted node's), a report that drops them, shows the wrong layer or a wrong
// exit profile, and a trace line with a missing or impossible exit layer accepted.
TEST(Report, SpecEETracesAndTheReportShowEachTokensExitLayer) {
    constexpr int kTokens = 24;
    std::vector<std::string> paths;
    for (const float threshold : {0.4f, 0.6f}) {
        auto engine = Engine::open(specee_engine(threshold, false));
        paths.push_back(artifacts_dir() + (threshold < 0.5f ? "/specee-exits.jsonl" : "/specee-full.jsonl"));
        TraceWriter trace(paths.back(), [&](int32_t t) { return engine->piece(t); });
        GenerationOptions go;
        go.n_predict = kTokens;
        go.stop_at_end_of_generation = false;
        go.on_exit = [&](const ExitReport & token) { trace.exit(token); };
        const GenerationStats st = engine->generate("def main():", go, [](const std::string &) { return true; });
        ASSERT_EQ(st.n_generated, kTokens);
    }
    const auto exits = trace_lines(paths[0], "exit"), fulls = trace_lines(paths[1], "exit");
    ASSERT_EQ(exits.size(), static_cast<size_t>(kTokens));
    ASSERT_EQ(fulls.size(), static_cast<size_t>(kTokens));
    for (size_t i = 0; i < exits.size(); ++i) {
        EXPECT_EQ(exits[i]["exit_layer"], 2) << exits[i].dump();
        EXPECT_EQ(exits[i]["n_layer"], 3);
        EXPECT_EQ(exits[i]["position"], exits[0]["position"].get<int>() + static_cast<int>(i));
        EXPECT_TRUE(fulls[i]["exit_layer"].is_null()) << fulls[i].dump();
    }

    // Lossless: every drafted node carries the layer it exited at (2), in the round's tree and
    // on its verification event.
    {
        auto engine = Engine::open(specee_engine(0.4f, true));
        paths.push_back(artifacts_dir() + "/specee-lossless.jsonl");
        TraceWriter trace(paths.back(), [&](int32_t t) { return engine->piece(t); });
        GenerationOptions go;
        go.n_predict = kTokens;
        go.stop_at_end_of_generation = false;
        go.on_round = [&](const RoundReport & round) { trace.round(round); };
        engine->generate("def main():", go, [](const std::string &) { return true; });
        int drafted_events = 0;
        for (const auto & round : trace_lines(paths.back(), "round")) {
            EXPECT_EQ(round["tree"]["exit_layer"].size(), round["tree"]["token"].size()) << round.dump();
            for (const auto & l : round["tree"]["exit_layer"]) EXPECT_EQ(l, 2);
        }
        for (const auto & t : trace_lines(paths.back(), "token")) {
            if (t["node"].get<int>() < 0) continue;
            ++drafted_events;
            EXPECT_EQ(t["exit_layer"], 2) << t.dump();
        }
        EXPECT_GT(drafted_events, 0);
    }

    const std::string html = artifacts_dir() + "/specee-report.html";
    const test::CommandRun made = test::run_command(std::string(SPECULA_CLI) + " report " + paths[0] + " " + paths[1] + " " + paths[2] + " -o " + html);
    ASSERT_EQ(made.exit_code, 0) << made.err;

    const std::string dir = artifacts_dir(), cli = SPECULA_CLI;
    std::ofstream(dir + "/no-exit-layer.jsonl") << R"({"kind":"exit","position":3,"token":5,"text":"a","n_layer":3})"
                                                << "\n";
    test::expect_cli_error(cli, "report " + dir + "/no-exit-layer.jsonl -o " + dir + "/x.html", "no-exit-layer.jsonl:1: no 'exit_layer' (a layer or null)");
    std::ofstream(dir + "/deep-exit.jsonl") << R"({"kind":"exit","position":3,"token":5,"text":"a","exit_layer":4,"n_layer":3})"
                                            << "\n";
    test::expect_cli_error(cli, "report " + dir + "/deep-exit.jsonl -o " + dir + "/x.html", "deep-exit.jsonl:1: 'exit_layer' is past the model's 'n_layer'");

    const std::string browser = chromium();
    if (browser.empty()) GTEST_SKIP() << "chromium is not installed (scripts/setup.sh --tests installs it): the page was written but not rendered";
    const std::string dom = render(browser, html, artifacts_dir() + "/specee-report.png");
    EXPECT_EQ(dom.find("id=\"js-error\""), std::string::npos) << dom.substr(dom.find("js-error"), 300);
    ASSERT_NE(dom.find("id=\"report-ready\""), std::string::npos) << "the page's script did not finish";
    const std::string marker = "<section class=\"run\" id=\"run-";
    ASSERT_EQ(count(dom, marker), 3u);
    const std::string run0 = dom.substr(dom.find(marker + "0"), dom.find(marker + "1") - dom.find(marker + "0"));
    const std::string run1 = dom.substr(dom.find(marker + "1"), dom.find(marker + "2") - dom.find(marker + "1"));
    const std::string run2 = dom.substr(dom.find(marker + "2"));
    EXPECT_EQ(count(run0, "data-exit-layer=\"2\""), static_cast<size_t>(kTokens));
    EXPECT_EQ(count(run0, "data-exit-layer=\"full\""), 0u);
    EXPECT_EQ(count(run1, "data-exit-layer=\"full\""), static_cast<size_t>(kTokens));
    EXPECT_NE(run0.find("exited 24/24 (100%), mean exit layer 2.0 of 3"), std::string::npos);
    EXPECT_NE(run1.find("exited 0/24 (0%), mean exit layer 3.0 of 3"), std::string::npos);
    for (const std::string & run : {run0, run1}) EXPECT_EQ(count(run, "class=\"bar-exit\""), 5u) << "layers 0..3 and full";
    EXPECT_NE(run2.find("SpecEE draft: exited at layer 2"), std::string::npos) << "the lossless run's tooltips name the exit layer";
}

TEST(Report, BadInputGivesOneErrorLine) {
    const std::string dir = artifacts_dir();
    const std::string cli = SPECULA_CLI;
    test::expect_cli_error(cli, "report /nonexistent.jsonl -o " + dir + "/x.html", "/nonexistent.jsonl: cannot open the trace");
    std::ofstream(dir + "/garbage.jsonl") << "{\"kind\":\"token\",\"round\":0}\nnot json\n";
    test::expect_cli_error(cli, "report " + dir + "/garbage.jsonl -o " + dir + "/x.html", "garbage.jsonl:1: no integer 'position'");
    std::ofstream(dir + "/empty.jsonl") << "";
    test::expect_cli_error(cli, "report " + dir + "/empty.jsonl -o " + dir + "/x.html", "no trace lines");
    std::ofstream(dir + "/cycle.jsonl")
        << R"({"kind":"round","round":0,"position":3,"asked":2,"verified_nodes":2,"draft_ms":1,"verify_ms":1,"accepted":[],)"
        << R"("tree":{"token":[1,2],"parent":[1,0],"depth":[1,2],"q":[1,1],"path_prob":[1,1],"text":["a","b"]}})"
        << "\n";
    test::expect_cli_error(cli, "report " + dir + "/cycle.jsonl -o " + dir + "/x.html", "cycle.jsonl:1: tree node 0 has a parent that is not an earlier node");
    test::expect_cli_error(cli, "report --bench " + std::string(SPECULA_SOURCE_DIR) + "/models/eval.json -o " + dir + "/x.html", "not a `bench spec --json` result");
    test::expect_cli_error(cli, "report -o " + dir + "/x.html", "no trace files given");
}

}  // namespace
}  // namespace specula
