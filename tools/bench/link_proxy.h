#pragma once
// A TCP proxy that delays every chunk by a fixed time in each direction: a network link of that
// latency between specula and an rpc-server, for machines whose kernel has no netem. It also
// counts round trips: each time the server starts answering after the client spoke (how often the
// client waited for the other side, whatever the protocol).
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace specula::bench {

class LinkProxy {
public:
    // Listens on 127.0.0.1 (an ephemeral port) and forwards each connection to host:port.
    LinkProxy(const std::string & host, int port, double delay_ms);
    ~LinkProxy();
    LinkProxy(const LinkProxy &) = delete;
    LinkProxy & operator=(const LinkProxy &) = delete;

    int port() const { return port_; }
    long round_trips() const { return round_trips_.load(); }
    void reset_counts() { round_trips_ = 0; }

private:
    struct Connection;
    void accept_loop();
    std::string host_;
    int upstream_port_;
    double delay_ms_;
    int listen_fd_ = -1;
    int port_ = 0;
    std::atomic<bool> stopping_{false};
    std::atomic<long> round_trips_{0};
    std::thread acceptor_;
    std::mutex mutex_;
    std::vector<std::unique_ptr<Connection>> connections_;
};

}  // namespace specula::bench
