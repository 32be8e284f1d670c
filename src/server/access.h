#pragma once
// Who may use `specula serve`: API keys, which web pages may call it (CORS, Origin), which Host
// names it answers (against DNS rebinding), and that API bodies are JSON. Pure
// decisions on a request's method, path and headers; server/http_server.cpp applies them before
// routing. docs/server.md, "Access".
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/openai.h"

namespace specula {

struct AccessPolicy {
    // Keys a request may present (Authorization: Bearer KEY, or X-Api-Key: KEY); empty: no key
    // needed. "/health" and the live page's HTML at "/" never need one.
    std::vector<std::string> api_keys;
    // Origins whose pages may call the server (scheme://host[:port], lower case; "*": any;
    // "localhost": any whose host is a loopback name, at any port, as llama-server's). A request
    // with another Origin, not the server's own, is refused (its preflight answered without CORS).
    std::vector<std::string> cors_origins;
    // Host names answered besides loopback names and IP addresses (lower case, without port; "*":
    // any name). A request with another Host is refused, whatever the address bound.
    std::vector<std::string> allowed_hosts;
    bool loopback_bind = false;  // bound to a loopback address: only this machine can connect
};

// What to do with a request: refuse it, answer a CORS preflight (200, with the CORS headers only
// for an allowed origin), or route it; `headers` go on the response in each case.
struct AccessDecision {
    std::optional<openai::ApiError> refusal;
    bool preflight = false;
    std::vector<std::pair<std::string, std::string>> headers;
};

// `header(name)` is the request's header `name` ("" when absent).
AccessDecision check_access(const AccessPolicy & policy, const std::string & method, const std::string & path,
                            const std::function<std::string(const char * name)> & header);

// Whose caches a request may reuse (server/scheduler.h, Tenancy): "anonymous" on a server without
// keys, else "key N" for the N-th key (1-based) the request presents, never the key itself; ""
// when it presents none of them (check_access refuses it).
std::string tenant_of(const AccessPolicy & policy, const std::function<std::string(const char * name)> & header);

// The policy of a server bound to `bind_host`, with the given keys, CORS origins and extra Host
// names (to which the machine's own name is added). Throws Error naming a key, origin or host
// name that cannot be one.
AccessPolicy make_access_policy(const std::string & bind_host, std::vector<std::string> api_keys,
                                const std::vector<std::string> & cors_origins, const std::vector<std::string> & allowed_hosts);

// The keys in a file: one a line; blank lines and lines starting with '#' are skipped. Throws
// Error when it cannot be read or holds no key.
std::vector<std::string> read_api_keys(const std::string & path);

// 127.0.0.0/8, ::1 or "localhost" (any case), as a bind address or a Host header's name.
bool is_loopback_name(const std::string & name);

}  // namespace specula
