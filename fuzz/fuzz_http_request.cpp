// libFuzzer target: the input is the raw bytes a client sends on one connection to `specula serve`
// (request line, headers, body: one request or several, well-formed or not). A server on loopback
// with a small model ($SPECULA_FUZZ_HTTP_MODEL, written by fuzz_seeds) answers them through its
// whole stack: the gate (heads, deadlines, sizes), cpp-httplib's parsing, the access checks, the
// routes, the request parser, the scheduler and the response or stream. Each input is sent on a new
// connection, whose write side is then closed, and the answer read until the server closes. A
// crash or sanitizer report anywhere in the server, a leak, or a connection the server leaves open
// past the request deadline is a finding.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "specula/error.h"
#include "engine/model_bundle.h"
#include "server/http_server.h"
#include "server/scheduler.h"

namespace {

// Kept for the whole run (reachable, so not leaks): a model and server per input would dominate the time.
specula::ModelBundle * g_bundle = nullptr;
specula::Scheduler * g_scheduler = nullptr;
specula::HttpServer * g_server = nullptr;
int g_port = 0;

// Deadlines far below the defaults: an input without the blank line that ends a head is answered
// 408 after the head deadline, and each such input costs that long.
constexpr specula::RequestDeadlines kDeadlines{std::chrono::milliseconds(300), std::chrono::milliseconds(2000)};

int connect_to_server() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(g_port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // libFuzzer's timers interrupt system calls (EINTR): a connect then goes on in the background.
    while (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0) {
        if (fd >= 0 && errno == EISCONN) break;
        if (fd < 0 || (errno != EINTR && errno != EALREADY)) {
            std::perror("fuzz_http_request: connect");
            std::abort();
        }
    }
    timeval timeout{5, 0};  // past the request deadline: the server must have answered and closed
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    return fd;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    const char * model = std::getenv("SPECULA_FUZZ_HTTP_MODEL");
    if (!model) {
        std::fprintf(stderr, "fuzz_http_request: set SPECULA_FUZZ_HTTP_MODEL to the model the server runs (scripts/fuzz.sh does)\n");
        std::exit(1);
    }
    std::signal(SIGPIPE, SIG_IGN);  // a server that closes early makes our writes fail, not kill us
    specula::EngineOptions engine;
    engine.model_path = model;
    engine.n_ctx = 256;
    engine.n_threads = 1;
    g_bundle = specula::ModelBundle::open(engine).release();
    g_scheduler = new specula::Scheduler(*g_bundle, specula::SchedulerOptions{});
    g_server = new specula::HttpServer(4, 1 << 16, kDeadlines);
    g_port = g_server->start("127.0.0.1", 0);
    g_server->ready(*g_bundle, *g_scheduler, {"model"});
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const int fd = connect_to_server();
    for (size_t sent = 0; sent < size;) {
        const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // the server answered and closed before reading it all
        sent += static_cast<size_t>(n);
    }
    ::shutdown(fd, SHUT_WR);
    char buf[4096];
    ssize_t n = 0;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0 || (n < 0 && errno == EINTR)) {
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        std::fprintf(stderr, "fuzz_http_request: the server kept the connection open past its request deadline\n");
        std::abort();
    }
    ::close(fd);
    return 0;
}
