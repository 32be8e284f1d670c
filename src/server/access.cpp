#include "server/access.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <regex>
#include <string_view>

#include "specula/error.h"

namespace specula {

namespace {

std::string lower(std::string s) {
    for (char & c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string trim(const std::string & s) {
    const size_t begin = s.find_first_not_of(" \t");
    if (begin == std::string::npos) return "";
    return s.substr(begin, s.find_last_not_of(" \t") + 1 - begin);
}

// The name in a Host header ("name", "name:port", "[v6]:port"), lower case, without brackets or port.
std::string host_name(const std::string & host) {
    if (!host.empty() && host.front() == '[') return lower(host.substr(1, host.find(']') - 1));
    const size_t colon = host.find(':');
    // Two colons: a bare IPv6 address, which has no port.
    if (colon == std::string::npos || host.find(':', colon + 1) != std::string::npos) return lower(host);
    return lower(host.substr(0, colon));
}

// The 1-based index of `presented` in `keys` (the first, when listed twice), 0 when it is none of
// them, in a time that depends on the keys' lengths only: every key is compared over its whole
// length, whatever matched before.
size_t key_index(const std::vector<std::string> & keys, const std::string & presented) {
    size_t found = 0;
    for (size_t k = keys.size(); k-- > 0;) {
        const std::string & key = keys[k];
        unsigned char diff = key.size() == presented.size() ? 0 : 1;
        for (size_t i = 0; i < key.size(); ++i) {
            diff |= static_cast<unsigned char>(key[i] ^ (presented.empty() ? 0 : presented[i % presented.size()]));
        }
        const size_t match = 0 - static_cast<size_t>(diff == 0);  // all ones on a match
        found = (found & ~match) | ((k + 1) & match);
    }
    return found;
}

// The key a request presents: "Authorization: Bearer KEY" (the scheme in any case), else "X-Api-Key: KEY".
std::string presented_key(const std::function<std::string(const char *)> & header) {
    const std::string authorization = trim(header("Authorization"));
    const size_t space = authorization.find(' ');
    if (space != std::string::npos && lower(authorization.substr(0, space)) == "bearer") return trim(authorization.substr(space + 1));
    return trim(header("X-Api-Key"));
}

// An origin (scheme://host[:port]) whose host is a loopback name: a page served from this machine.
bool is_loopback_origin(const std::string & origin) {
    const size_t scheme_end = origin.find("://");
    return scheme_end != std::string::npos && is_loopback_name(host_name(origin.substr(scheme_end + 3)));
}

bool is_ip_address(const std::string & name) {
    in_addr v4{};
    in6_addr v6{};
    return inet_pton(AF_INET, name.c_str(), &v4) == 1 || inet_pton(AF_INET6, name.c_str(), &v6) == 1;
}

// "application/json" with any parameters ("; charset=utf-8"), in any case.
bool is_json(const std::string & content_type) { return lower(trim(content_type.substr(0, content_type.find(';')))) == "application/json"; }

// A comma-separated list of HTTP header names (RFC 9110 tokens), spaces around the commas allowed.
bool header_names(const std::string & list) {
    constexpr size_t kMaxBytes = 2048;
    if (list.empty() || list.size() > kMaxBytes) return false;
    bool name = false;  // the current item has a character of a name
    for (char c : list) {
        const bool token = std::isalnum(static_cast<unsigned char>(c)) || std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
        if (token) name = true;
        else if (c == ',' && name) name = false;
        else if (c != ' ' && c != '\t') return false;
    }
    return name;
}

openai::ApiError refuse(int status, const std::string & type, const std::string & code, const std::string & message) {
    return openai::ApiError{status, message, type, "", code};
}

}  // namespace

bool is_loopback_name(const std::string & name) {
    const std::string n = lower(name);
    if (n == "localhost") return true;
    in_addr v4{};
    if (inet_pton(AF_INET, n.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
    in6_addr v6{};
    return inet_pton(AF_INET6, n.c_str(), &v6) == 1 && std::memcmp(&v6, &in6addr_loopback, sizeof(v6)) == 0;
}

AccessDecision check_access(const AccessPolicy & policy, const std::string & method, const std::string & path,
                            const std::function<std::string(const char * name)> & header) {
    AccessDecision d;
    const std::string host = header("Host");
    // A page of another site whose name was made to resolve to the server's address (DNS
    // rebinding: 127.0.0.1, or a LAN address) reaches the server as its own origin, but its Host
    // is still that site's name; an address typed as such cannot be rebound. A request without a
    // Host (HTTP/1.0) comes from no browser.
    if (!host.empty()) {
        const std::string name = host_name(host);
        const auto & allowed = policy.allowed_hosts;
        const bool answered = is_loopback_name(name) || is_ip_address(name) || std::find(allowed.begin(), allowed.end(), name) != allowed.end() ||
                              std::find(allowed.begin(), allowed.end(), "*") != allowed.end();
        if (!answered) {
            d.refusal = refuse(403, "permission_error", "host_not_allowed",
                               "the Host '" + host + "' is not this server's: it answers localhost, IP addresses and this machine's name (--allowed-host NAME adds a name)");
            return d;
        }
    }
    // A page's script sends its Origin; a foreign page's "simple" request (a form POST, text/plain)
    // needs no preflight, so it is refused here rather than merely left unreadable. Its preflight
    // is answered without CORS headers, as llama-server answers it: the browser then sends nothing.
    const std::string origin = lower(header("Origin"));
    const bool listed = !origin.empty() && std::any_of(policy.cors_origins.begin(), policy.cors_origins.end(), [&](const std::string & o) {
        return o == "*" || (o == "localhost" ? is_loopback_origin(origin) : o == origin);
    });
    const bool preflight = method == "OPTIONS" && !header("Access-Control-Request-Method").empty();
    if (!origin.empty() && !listed && preflight) {
        d.preflight = true;
        return d;
    }
    if (!origin.empty() && !listed && origin != "http://" + lower(host) && origin != "https://" + lower(host)) {
        d.refusal = refuse(403, "permission_error", "origin_not_allowed",
                           "pages from the origin '" + origin + "' may not call this server (--cors-origin ORIGIN allows one)");
        return d;
    }
    if (listed) {
        const bool any = std::find(policy.cors_origins.begin(), policy.cors_origins.end(), "*") != policy.cors_origins.end();
        d.headers.emplace_back("Access-Control-Allow-Origin", any ? "*" : origin);
        if (!any) d.headers.emplace_back("Vary", "Origin");
        if (preflight) {
            d.preflight = true;
            d.headers.emplace_back("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            // The headers the page's script will send, as it asks for them (the openai npm SDK's
            // x-stainless-*); a list that is not header names gets the ones the server reads.
            const std::string asked = header("Access-Control-Request-Headers");
            d.headers.emplace_back("Access-Control-Allow-Headers", header_names(asked) ? asked : "Authorization, Content-Type, X-Api-Key");
            d.headers.emplace_back("Vary", "Access-Control-Request-Headers");
            d.headers.emplace_back("Access-Control-Max-Age", "600");
            return d;
        }
    }
    const bool open_route = (method == "GET" || method == "HEAD") && (path == "/" || path == "/health" || path == "/v1/health");
    if (!policy.api_keys.empty() && !open_route) {
        const std::string key = presented_key(header);
        if (key.empty() || key_index(policy.api_keys, key) == 0) {
            // llama-server's type (its clients and test suite check it) with OpenAI's code: the
            // openai clients raise AuthenticationError on the status alone.
            d.refusal = refuse(401, "authentication_error", "invalid_api_key",
                               key.empty() ? "no API key: send it as 'Authorization: Bearer KEY'" : "the API key is not valid");
            d.headers.emplace_back("WWW-Authenticate", "Bearer");
        }
    }
    const bool has_body = method == "POST" || method == "PUT" || method == "PATCH";
    if (!d.refusal && has_body && !is_json(header("Content-Type"))) {
        const std::string given = header("Content-Type");
        d.refusal = refuse(415, "invalid_request_error", "unsupported_media_type",
                           "the body must be JSON sent as 'Content-Type: application/json'" + (given.empty() ? std::string(" (none given)") : ", not '" + given + "'"));
    }
    // A refused body is never read: on a kept-alive connection its bytes would be taken for the
    // next request.
    if (d.refusal && (!header("Content-Length").empty() || !header("Transfer-Encoding").empty())) d.headers.emplace_back("Connection", "close");
    return d;
}

std::string tenant_of(const AccessPolicy & policy, const std::function<std::string(const char * name)> & header) {
    if (policy.api_keys.empty()) return "anonymous";
    const size_t index = key_index(policy.api_keys, presented_key(header));
    return index == 0 ? "" : "key " + std::to_string(index);
}

AccessPolicy make_access_policy(const std::string & bind_host, std::vector<std::string> api_keys,
                                const std::vector<std::string> & cors_origins, const std::vector<std::string> & allowed_hosts) {
    AccessPolicy p;
    for (size_t i = 0; i < api_keys.size(); ++i) {
        const std::string & key = api_keys[i];
        if (key.empty() || !std::all_of(key.begin(), key.end(), [](char c) { return c > ' ' && c < 0x7f; })) {
            throw Error("API key " + std::to_string(i + 1) + " of " + std::to_string(api_keys.size()) +
                        " is empty or has a character other than printable ASCII (no spaces): a header cannot carry it");
        }
    }
    p.api_keys = std::move(api_keys);
    const std::regex origin_form("[a-z][a-z0-9+.-]*://[^/?#\\s]+");
    for (const std::string & origin : cors_origins) {
        const std::string o = lower(origin);
        if (o != "*" && o != "null" && o != "localhost" && !std::regex_match(o, origin_form)) {
            throw Error("--cors-origin '" + origin +
                        "' is not an origin: scheme://host[:port] without a path (e.g. http://localhost:3000), "
                        "localhost (any page of this machine) or *");
        }
        p.cors_origins.push_back(o);
    }
    for (const std::string & host : allowed_hosts) {
        if (host.empty() || host.find_first_of("/ \t") != std::string::npos) {
            throw Error("--allowed-host '" + host + "' is not a host name (e.g. specula.example)");
        }
        p.allowed_hosts.push_back(host == "*" ? host : host_name(host));
    }
    // The machine's own name: how the hosts of a network reach a server bound to every interface.
    char own[256] = "";
    if (::gethostname(own, sizeof own - 1) == 0 && own[0] != '\0') p.allowed_hosts.push_back(lower(own));
    p.loopback_bind = is_loopback_name(bind_host);
    return p;
}

std::vector<std::string> read_api_keys(const std::string & path) {
    std::ifstream in(path);
    if (!in) throw Error("cannot read the API key file " + path + ": " + std::strerror(errno));
    std::vector<std::string> keys;
    for (std::string line; std::getline(in, line);) {
        line = trim(line);
        if (!line.empty() && line.back() == '\r') line = trim(line.substr(0, line.size() - 1));
        if (!line.empty() && line.front() != '#') keys.push_back(line);
    }
    if (keys.empty()) throw Error("the API key file " + path + " holds no key (one a line; '#' starts a comment line)");
    return keys;
}

}  // namespace specula
