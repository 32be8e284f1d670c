// `specula serve`'s access decisions (server/access.h) on requests described by their method, path
// and headers; tests/server/test_access.py checks the same through a running server.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <strings.h>
#include <unistd.h>

#include "server/access.h"
#include "specula/error.h"

namespace specula {
namespace {

using Headers = std::map<std::string, std::string>;

// The decision for a request with `headers`, from a client on this machine unless they name
// another Host.
AccessDecision decide(const AccessPolicy & policy, const std::string & method, const std::string & path, Headers headers = {}) {
    headers.emplace("Host", "127.0.0.1:8080");
    return check_access(policy, method, path, [&](const char * name) {
        for (const auto & [key, value] : headers) {
            if (strcasecmp(key.c_str(), name) == 0) return value;
        }
        return std::string();
    });
}

std::string header_of(const AccessDecision & d, const std::string & name) {
    for (const auto & [key, value] : d.headers) {
        if (key == name) return value;
    }
    return "<none>";
}

int status_of(const AccessDecision & d) { return d.refusal ? d.refusal->status : 0; }

const Headers kJson = {{"Content-Type", "application/json"}, {"Content-Length", "2"}};

AccessPolicy keyed(std::vector<std::string> keys) { return make_access_policy("127.0.0.1", std::move(keys), {}, {}); }

// Catches a default policy that refuses ordinary clients (curl, the openai client, the live page on
// its own origin) or adds headers nobody asked for.
TEST(Access, TheDefaultPolicyLetsClientsAndTheServersOwnPageThrough) {
    const AccessPolicy open = make_access_policy("127.0.0.1", {}, {}, {});
    for (const char * path : {"/", "/health", "/metrics", "/metrics.json", "/slots", "/v1/models"}) {
        const AccessDecision d = decide(open, "GET", path);
        EXPECT_FALSE(d.refusal) << path;
        EXPECT_FALSE(d.preflight) << path;
        EXPECT_TRUE(d.headers.empty()) << path;
    }
    Headers own_page = kJson;
    own_page["Origin"] = "http://127.0.0.1:8080";
    EXPECT_FALSE(decide(open, "POST", "/v1/chat/completions", own_page).refusal);
    EXPECT_FALSE(decide(open, "POST", "/v1/completions", kJson).refusal);
}

// Catches data routes served without the key, or /health and the page's HTML locked (a health
// check and a browser opening the page carry no key).
TEST(Access, WithAKeyEveryRouteButHealthAndThePageNeedsIt) {
    const AccessPolicy policy = keyed({"sk-right"});
    for (const char * path : {"/", "/health"}) {
        EXPECT_FALSE(decide(policy, "GET", path).refusal) << path;
        EXPECT_FALSE(decide(policy, "HEAD", path).refusal) << path;
    }
    for (const char * path : {"/metrics", "/metrics.json", "/slots", "/v1/models", "/nowhere", "/health/x"}) {
        const AccessDecision d = decide(policy, "GET", path);
        ASSERT_EQ(status_of(d), 401) << path;
        EXPECT_EQ(d.refusal->code, "invalid_api_key");
        EXPECT_EQ(d.refusal->type, "authentication_error");  // llama-server's type, beside OpenAI's code
        EXPECT_NE(d.refusal->message.find("no API key"), std::string::npos) << d.refusal->message;
        EXPECT_EQ(header_of(d, "WWW-Authenticate"), "Bearer");
        Headers with_key{{"Authorization", "Bearer sk-right"}};
        EXPECT_FALSE(decide(policy, "GET", path, with_key).refusal) << path;
    }
    for (const char * path : {"/v1/chat/completions", "/v1/completions"}) EXPECT_EQ(status_of(decide(policy, "POST", path, kJson)), 401) << path;
    const nlohmann::json body = decide(policy, "GET", "/slots").refusal->body();
    EXPECT_TRUE(body["error"]["param"].is_null());
    EXPECT_EQ(body["error"]["code"], "invalid_api_key");
}

// Catches a key compared as a prefix, a wrong key let through, the bearer scheme read case by
// case, or a second key ignored.
TEST(Access, OnlyAWholeConfiguredKeyOpensAsBearerOrXApiKey) {
    const AccessPolicy policy = keyed({"sk-first", "sk-second"});
    for (const std::string authorization : {"Bearer sk-first", "bearer sk-second", "BEARER   sk-first  "}) {
        EXPECT_FALSE(decide(policy, "GET", "/v1/models", {{"Authorization", authorization}}).refusal) << authorization;
    }
    EXPECT_FALSE(decide(policy, "GET", "/v1/models", {{"X-Api-Key", "sk-second"}}).refusal);
    for (const std::string authorization : {"Bearer sk-firs", "Bearer sk-first2", "Bearer sk-third", "Bearer SK-FIRST", "sk-first", "Basic sk-first", "Bearer"}) {
        const AccessDecision d = decide(policy, "GET", "/v1/models", {{"Authorization", authorization}});
        EXPECT_EQ(status_of(d), 401) << authorization;
    }
    const AccessDecision wrong = decide(policy, "GET", "/v1/models", {{"Authorization", "Bearer sk-third"}});
    EXPECT_NE(wrong.refusal->message.find("not valid"), std::string::npos) << wrong.refusal->message;
    EXPECT_EQ(wrong.refusal->message.find("sk-"), std::string::npos) << "a refusal must not echo keys: " << wrong.refusal->message;
}

// Catches: two keys taken for one tenant (sharing their caches), a tenant named by the key itself,
// or a server without keys split into tenants.
TEST(Access, EachKeyIsATenantNamedByItsPositionNeverByTheKey) {
    auto tenant = [](const AccessPolicy & policy, Headers headers) {
        return tenant_of(policy, [&](const char * name) {
            for (const auto & [key, value] : headers) {
                if (strcasecmp(key.c_str(), name) == 0) return value;
            }
            return std::string();
        });
    };
    const AccessPolicy policy = keyed({"sk-first", "sk-second", "sk-first"});
    EXPECT_EQ(tenant(policy, {{"Authorization", "Bearer sk-first"}}), "key 1");
    EXPECT_EQ(tenant(policy, {{"X-Api-Key", "sk-second"}}), "key 2");
    EXPECT_EQ(tenant(policy, {{"Authorization", "Bearer sk-third"}}), "");
    EXPECT_EQ(tenant(policy, {}), "");
    EXPECT_EQ(tenant(keyed({}), {{"Authorization", "Bearer anything"}}), "anonymous");
}

// Catches a body parsed whatever its type: a foreign page's text/plain or form POST needs no CORS
// preflight, so JSON is required of every POST.
TEST(Access, PostsMustSendJson) {
    const AccessPolicy open = make_access_policy("127.0.0.1", {}, {}, {});
    for (const std::string type : {"application/json", "Application/JSON; charset=utf-8", " application/json ;charset=UTF-8"}) {
        EXPECT_FALSE(decide(open, "POST", "/v1/chat/completions", {{"Content-Type", type}}).refusal) << type;
    }
    for (const std::string type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonp", ""}) {
        Headers h{{"Content-Length", "20"}};
        if (!type.empty()) h["Content-Type"] = type;
        const AccessDecision d = decide(open, "POST", "/v1/completions", h);
        ASSERT_EQ(status_of(d), 415) << type;
        EXPECT_EQ(d.refusal->code, "unsupported_media_type");
        EXPECT_NE(d.refusal->message.find(type.empty() ? "none given" : type), std::string::npos) << d.refusal->message;
        EXPECT_EQ(header_of(d, "Connection"), "close") << "the unread body would be read as the next request";
    }
    EXPECT_FALSE(decide(open, "GET", "/v1/models", {{"Content-Type", "text/plain"}}).refusal);
}

// Catches a foreign page allowed to drive the server (a simple request needs no preflight), an
// Access-Control-Allow-Origin sent for an origin nobody allowed, or the server's own page refused.
TEST(Access, ForeignOriginsAreRefusedUnlessAllowed) {
    const AccessPolicy none = make_access_policy("127.0.0.1", {}, {}, {});
    for (const char * origin : {"http://evil.example", "http://127.0.0.1:8081", "https://127.0.0.1:9", "null"}) {
        const AccessDecision d = decide(none, "POST", "/v1/chat/completions", {{"Origin", origin}, {"Content-Type", "text/plain"}});
        ASSERT_EQ(status_of(d), 403) << origin;
        EXPECT_EQ(d.refusal->code, "origin_not_allowed");
        EXPECT_EQ(header_of(d, "Access-Control-Allow-Origin"), "<none>");
        EXPECT_EQ(status_of(decide(none, "GET", "/metrics.json", {{"Origin", origin}})), 403) << origin;
    }
    for (const char * own : {"http://127.0.0.1:8080", "HTTP://127.0.0.1:8080", "https://127.0.0.1:8080"}) {
        const AccessDecision d = decide(none, "GET", "/slots", {{"Origin", own}});
        EXPECT_FALSE(d.refusal) << own;
        EXPECT_EQ(header_of(d, "Access-Control-Allow-Origin"), "<none>") << "same origin needs no CORS";
    }

    const AccessPolicy listed = make_access_policy("127.0.0.1", {}, {"http://localhost:3000", "HTTPS://App.Example"}, {});
    for (const char * origin : {"http://localhost:3000", "https://app.example"}) {
        const AccessDecision d = decide(listed, "POST", "/v1/completions", {{"Origin", origin}, {"Content-Type", "application/json"}});
        EXPECT_FALSE(d.refusal) << origin;
        EXPECT_EQ(header_of(d, "Access-Control-Allow-Origin"), origin);
        EXPECT_EQ(header_of(d, "Vary"), "Origin");
    }
    EXPECT_EQ(status_of(decide(listed, "GET", "/v1/models", {{"Origin", "http://localhost:3001"}})), 403);

    const AccessPolicy any = make_access_policy("127.0.0.1", {}, {"*"}, {});
    const AccessDecision d = decide(any, "GET", "/v1/models", {{"Origin", "http://anything.example"}});
    EXPECT_FALSE(d.refusal);
    EXPECT_EQ(header_of(d, "Access-Control-Allow-Origin"), "*");
}

// Catches --cors-origin localhost (llama-server's value) refused, a loopback page at another port
// refused, or a foreign name that starts with "localhost" allowed.
TEST(Access, TheLocalhostOriginAllowsEveryPageOfThisMachine) {
    const AccessPolicy policy = make_access_policy("127.0.0.1", {}, {"localhost"}, {});
    for (const char * origin : {"http://localhost", "http://localhost:8080", "http://127.0.0.1", "https://127.0.0.1:3000", "http://[::1]", "http://[::1]:3000"}) {
        const AccessDecision d = decide(policy, "OPTIONS", "/v1/completions", {{"Origin", origin}, {"Access-Control-Request-Method", "POST"}});
        EXPECT_TRUE(d.preflight) << origin;
        EXPECT_EQ(header_of(d, "Access-Control-Allow-Origin"), origin);
        EXPECT_FALSE(decide(policy, "POST", "/v1/completions", {{"Origin", origin}, {"Content-Type", "application/json"}}).refusal) << origin;
    }
    for (const char * origin : {"http://web.mydomain.fr", "http://notlocalhost", "http://localhost.evil.com", "localhost"}) {
        const AccessDecision d = decide(policy, "OPTIONS", "/v1/completions", {{"Origin", origin}, {"Access-Control-Request-Method", "POST"}});
        EXPECT_EQ(header_of(d, "Access-Control-Allow-Origin"), "<none>") << origin;
        EXPECT_EQ(status_of(decide(policy, "POST", "/v1/completions", {{"Origin", origin}, {"Content-Type", "application/json"}})), 403) << origin;
    }
}

// Catches a preflight refused for an allowed origin (or made to carry the key, which browsers
// never send on one), answered for an origin nobody allowed, or allowing fewer headers than the
// page's script asks for (the openai npm SDK's x-stainless-*: the browser then sends nothing).
TEST(Access, PreflightsOfAllowedOriginsAreAnsweredWithoutTheKey) {
    const AccessPolicy policy = make_access_policy("127.0.0.1", {"sk-right"}, {"http://localhost:3000"}, {});
    const Headers preflight{{"Origin", "http://localhost:3000"}, {"Access-Control-Request-Method", "POST"}, {"Access-Control-Request-Headers", "authorization,content-type"}};
    const AccessDecision d = decide(policy, "OPTIONS", "/v1/chat/completions", preflight);
    EXPECT_FALSE(d.refusal);
    EXPECT_TRUE(d.preflight);
    EXPECT_EQ(header_of(d, "Access-Control-Allow-Origin"), "http://localhost:3000");
    EXPECT_NE(header_of(d, "Access-Control-Allow-Methods").find("POST"), std::string::npos);
    EXPECT_EQ(header_of(d, "Access-Control-Allow-Headers"), "authorization,content-type");
    Headers sdk = preflight;
    sdk["Access-Control-Request-Headers"] = "authorization, content-type, x-stainless-arch, x-stainless-lang, x-stainless-retry-count";
    EXPECT_EQ(header_of(decide(policy, "OPTIONS", "/v1/chat/completions", sdk), "Access-Control-Allow-Headers"), sdk["Access-Control-Request-Headers"]);
    for (const char * malformed : {"x-a\r\nSet-Cookie: a=b", "x-a,", "x:a", ""}) {
        Headers odd = preflight;
        odd["Access-Control-Request-Headers"] = malformed;
        EXPECT_EQ(header_of(decide(policy, "OPTIONS", "/v1/chat/completions", odd), "Access-Control-Allow-Headers"), "Authorization, Content-Type, X-Api-Key")
            << malformed;
    }

    // A foreign origin's preflight is answered as llama-server answers it, without the CORS
    // headers that would let its page send the request.
    Headers foreign = preflight;
    foreign["Origin"] = "http://evil.example";
    const AccessDecision unlisted = decide(policy, "OPTIONS", "/v1/chat/completions", foreign);
    EXPECT_FALSE(unlisted.refusal);
    EXPECT_TRUE(unlisted.preflight);
    EXPECT_TRUE(unlisted.headers.empty());

    // The actual request after the preflight still needs the key, and its 401 carries the CORS
    // header so that the page can read why.
    const AccessDecision keyless = decide(policy, "POST", "/v1/chat/completions", {{"Origin", "http://localhost:3000"}, {"Content-Type", "application/json"}});
    EXPECT_EQ(status_of(keyless), 401);
    EXPECT_EQ(header_of(keyless, "Access-Control-Allow-Origin"), "http://localhost:3000");
}

// Catches DNS rebinding: a page on evil.example whose name resolves to the server's address is
// its own origin, so only the Host tells it from the server's own page; on every bind, loopback or
// not (a LAN address can be rebound as 127.0.0.1 can), and --allowed-host honoured on each.
TEST(Access, OnEveryBindOnlyLoopbackAddressedOrAllowedHostsAreAnswered) {
    const auto with_host = [&](const AccessPolicy & p, const std::string & host, Headers h = {}) {
        h["Host"] = host;
        return decide(p, "GET", "/v1/models", h);
    };
    for (const char * bind : {"127.0.0.1", "0.0.0.0", "::", "192.0.2.7"}) {
        SCOPED_TRACE(bind);
        const AccessPolicy policy = make_access_policy(bind, {}, {}, {"Specula.Example:443"});
        EXPECT_EQ(policy.loopback_bind, std::string(bind) == "127.0.0.1");
        for (const char * host : {"localhost", "LOCALHOST:8080", "127.0.0.1", "127.1.2.3:80", "[::1]", "[::1]:8080", "specula.example",
                                  "specula.example:8080", "192.0.2.7:8080", "10.0.0.1", "[2001:db8::7]:80", "0.0.0.0"}) {
            EXPECT_FALSE(with_host(policy, host).refusal) << host;
        }
        for (const char * host : {"evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.1.evil.example", "192.0.2.7.nip.example"}) {
            const AccessDecision d = with_host(policy, host);
            ASSERT_EQ(status_of(d), 403) << host;
            EXPECT_EQ(d.refusal->code, "host_not_allowed");
        }
        const AccessDecision rebound = with_host(policy, "evil.example:8080", {{"Origin", "http://evil.example:8080"}});
        EXPECT_EQ(status_of(rebound), 403) << "the rebound page's origin equals its Host";
        EXPECT_FALSE(with_host(policy, "").refusal) << "HTTP/1.0 clients send no Host; no browser omits it";
    }
    EXPECT_FALSE(with_host(make_access_policy("0.0.0.0", {}, {}, {"*"}), "any.example").refusal);
    char own[256] = "";
    ASSERT_EQ(::gethostname(own, sizeof own - 1), 0);
    EXPECT_FALSE(with_host(make_access_policy("0.0.0.0", {}, {}, {}), own).refusal) << "the machine's own name";
}

TEST(Access, LoopbackNames) {
    for (const char * name : {"localhost", "LocalHost", "127.0.0.1", "127.255.255.254", "::1", "0:0:0:0:0:0:0:1"}) EXPECT_TRUE(is_loopback_name(name)) << name;
    for (const char * name : {"", "0.0.0.0", "::", "128.0.0.1", "127.0.0", "localhost.example", "::2", "::ffff:10.0.0.1"}) EXPECT_FALSE(is_loopback_name(name)) << name;
}

// Catches a key or origin that can never match accepted silently (the operator would believe the
// server locked, or a page allowed), and a key file read wrongly.
TEST(Access, BadKeysOriginsAndHostsAreRefusedNamingThem) {
    const auto message = [](auto make) {
        try {
            make();
        } catch (const Error & e) {
            return std::string(e.what());
        }
        return std::string("<no error>");
    };
    EXPECT_NE(message([] { keyed({"sk-ok", "has space"}); }).find("API key 2 of 2"), std::string::npos);
    EXPECT_NE(message([] { keyed({""}); }).find("API key 1 of 1"), std::string::npos);
    EXPECT_NE(message([] { make_access_policy("127.0.0.1", {}, {"http://localhost:3000/"}, {}); }).find("'http://localhost:3000/' is not an origin"), std::string::npos);
    EXPECT_NE(message([] { make_access_policy("127.0.0.1", {}, {"localhost:3000"}, {}); }).find("is not an origin"), std::string::npos);
    EXPECT_NE(message([] { make_access_policy("127.0.0.1", {}, {}, {"http://x.example/"}); }).find("--allowed-host 'http://x.example/'"), std::string::npos);

    const std::string dir = std::filesystem::temp_directory_path() / ("specula-access-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/keys") << "# keys of the team\n\nsk-one\r\n  sk-two  \n";
    EXPECT_EQ(read_api_keys(dir + "/keys"), (std::vector<std::string>{"sk-one", "sk-two"}));
    std::ofstream(dir + "/empty") << "# nothing yet\n\n";
    EXPECT_NE(message([&] { read_api_keys(dir + "/empty"); }).find("holds no key"), std::string::npos);
    EXPECT_NE(message([&] { read_api_keys(dir + "/absent"); }).find("cannot read the API key file " + dir + "/absent"), std::string::npos);
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace specula
