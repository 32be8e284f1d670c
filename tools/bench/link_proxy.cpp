#include "link_proxy.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>

#include "specula/error.h"

namespace specula::bench {

namespace {

using Clock = std::chrono::steady_clock;

int connect_to(const std::string & host, int port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo * found = nullptr;
    if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
    int fd = -1;
    for (addrinfo * a = found; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(found);
    return fd;
}

void no_delay(int fd) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

// One direction of a connection: a reader stamps each chunk with the time it may leave, a writer
// sends it then, so the link delays every byte by the same time without limiting throughput.
struct Pipe {
    int from = -1, to = -1;
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::pair<Clock::time_point, std::vector<char>>> chunks;
    bool closed = false;
    std::thread reader, writer;
};

struct LinkProxy::Connection {
    int client = -1, server = -1;
    std::atomic<int> last_sender{0};  // 1: the client spoke last, 2: the server did
    Pipe up, down;                    // client -> server, server -> client
    ~Connection() {
        shutdown(client, SHUT_RDWR);
        shutdown(server, SHUT_RDWR);
        for (Pipe * p : {&up, &down}) {
            {
                std::lock_guard<std::mutex> lock(p->mutex);
                p->closed = true;
            }
            p->ready.notify_all();
            if (p->reader.joinable()) p->reader.join();
            if (p->writer.joinable()) p->writer.join();
        }
        close(client);
        close(server);
    }
};

LinkProxy::LinkProxy(const std::string & host, int port, double delay_ms) : host_(host), upstream_port_(port), delay_ms_(delay_ms) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 || listen(listen_fd_, 16) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
        if (listen_fd_ >= 0) close(listen_fd_);
        throw Error("link proxy: cannot listen on 127.0.0.1");
    }
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
}

LinkProxy::~LinkProxy() {
    stopping_ = true;
    shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
    acceptor_.join();
    close(listen_fd_);
    connections_.clear();
}

void LinkProxy::accept_loop() {
    const auto delay = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(delay_ms_));
    while (!stopping_) {
        const int client = accept(listen_fd_, nullptr, nullptr);
        if (client < 0) continue;
        const int server = connect_to(host_, upstream_port_);
        if (server < 0) {
            close(client);
            continue;
        }
        no_delay(client);
        no_delay(server);
        auto c = std::make_unique<Connection>();
        c->client = client;
        c->server = server;
        Connection * conn = c.get();
        auto start = [&](Pipe & p, int from, int to, int sender) {
            p.from = from;
            p.to = to;
            p.reader = std::thread([this, conn, &p, sender, delay] {
                std::vector<char> buf(1 << 16);
                while (true) {
                    const ssize_t n = recv(p.from, buf.data(), buf.size(), 0);
                    const auto leave = Clock::now() + delay;
                    if (n > 0 && sender == 2 && conn->last_sender.exchange(2) == 1) ++round_trips_;
                    if (n > 0 && sender == 1) conn->last_sender = 1;
                    std::lock_guard<std::mutex> lock(p.mutex);
                    if (n <= 0) {
                        p.closed = true;
                        p.ready.notify_all();
                        return;
                    }
                    p.chunks.emplace_back(leave, std::vector<char>(buf.begin(), buf.begin() + n));
                    p.ready.notify_all();
                }
            });
            p.writer = std::thread([&p] {
                while (true) {
                    std::unique_lock<std::mutex> lock(p.mutex);
                    p.ready.wait(lock, [&] { return p.closed || !p.chunks.empty(); });
                    if (p.chunks.empty()) break;
                    auto [leave, data] = std::move(p.chunks.front());
                    p.chunks.pop_front();
                    lock.unlock();
                    std::this_thread::sleep_until(leave);
                    for (size_t sent = 0; sent < data.size();) {
                        const ssize_t n = send(p.to, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
                        if (n <= 0) return;
                        sent += static_cast<size_t>(n);
                    }
                }
                shutdown(p.to, SHUT_WR);  // the other side sees the close after the last delayed byte
            });
        };
        start(conn->up, client, server, 1);
        start(conn->down, server, client, 2);
        std::lock_guard<std::mutex> lock(mutex_);
        connections_.push_back(std::move(c));
    }
}

}  // namespace specula::bench
