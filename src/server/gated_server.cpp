#include "server/gated_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "specula/error.h"

namespace specula {

using Clock = std::chrono::steady_clock;

struct GatedServer::Waiting {
    socket_t sock;
    Clock::time_point accepted;  // or, kept alive, when its next request's first byte came
    std::string head;            // the bytes received so far: the head, and what followed it in the same reads
    bool idle = false;           // kept alive after a response, and no byte of a next request yet
    size_t served = 0;           // requests answered on the connection so far
};

namespace {
thread_local bool response_closes = false;  // the response just written said "Connection: close"
}  // namespace

namespace {

thread_local bool timed_out_on_this_thread = false;

// The accept loop runs each task at once: a task only hands the new connection to the waiting
// room (process_and_close_socket below), so the loop never waits on a client.
class HandOver final : public httplib::TaskQueue {
public:
    bool enqueue(std::function<void()> fn) override {
        fn();
        return true;
    }
    void shutdown() override {}
};

std::string seconds_text(std::chrono::milliseconds d) {
    std::ostringstream o;
    o << d.count() / 1000.0 << " s";
    return o.str();
}

int remaining_ms(Clock::time_point deadline) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(ms, 0, 60'000));
}

bool wait_for(socket_t sock, short events, int timeout_ms) {
    pollfd p{sock, events, 0};
    int n;
    do n = ::poll(&p, 1, timeout_ms);
    while (n < 0 && errno == EINTR);
    return n > 0;
}

void address_of(const sockaddr_storage & a, std::string & ip, int & port) {
    char text[INET6_ADDRSTRLEN] = "";
    if (a.ss_family == AF_INET) {
        const auto & v4 = reinterpret_cast<const sockaddr_in &>(a);
        inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text);
        port = ntohs(v4.sin_port);
    } else if (a.ss_family == AF_INET6) {
        const auto & v6 = reinterpret_cast<const sockaddr_in6 &>(a);
        inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text);
        port = ntohs(v6.sin6_port);
    }
    ip = text;
}

// A served connection: first the bytes the waiting room received (the whole head, perhaps the
// start of the body), then the socket, whose reads end at the request deadline or once `cut`.
class ConnectionStream final : public httplib::Stream {
public:
    ConnectionStream(socket_t sock, std::string received, Clock::time_point read_deadline, const std::atomic<bool> & cut,
                     std::chrono::milliseconds write_timeout)
        : sock_(sock), received_(std::move(received)), read_deadline_(read_deadline), cut_(cut), write_timeout_(write_timeout), start_(Clock::now()) {}

    bool is_readable() const override { return offset_ < received_.size(); }
    bool wait_readable() const override {
        if (is_readable()) return true;
        while (Clock::now() < read_deadline_ && !cut_) {  // in slices, to see `cut`
            if (wait_for(sock_, POLLIN, std::min(remaining_ms(read_deadline_), 200))) return true;
        }
        timed_out_on_this_thread = !cut_;
        return false;
    }
    bool wait_writable() const override { return wait_for(sock_, POLLOUT, static_cast<int>(write_timeout_.count())); }
    bool is_peer_alive() const override { return !client_gone(); }
    // Whether the client closed the connection or reset it. The end of its data alone is no sign:
    // a client may shut its sending side after the request (shutdown(SHUT_WR)) and still read.
    // Such an end could be either; before anything of the response went, the response's first
    // bytes go early ("HTTP/1.1 " starts every response), which a half-closed client reads as
    // the answer's start and a closed socket answers with a reset, seen by the next call.
    bool client_gone() const {
        pollfd p{sock_, POLLIN, 0};
        if (::poll(&p, 1, 0) <= 0) return false;
        if (p.revents & (POLLERR | POLLHUP)) return true;  // reset, or both sides shut
        char byte;
        const ssize_t n = ::recv(sock_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n > 0) return false;  // the start of a pipelined request
        if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
        if (!wrote_ && sent_early_ == 0) {
            const ssize_t sent = ::send(sock_, kResponseStart, sizeof kResponseStart - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (sent < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
            sent_early_ = static_cast<size_t>(sent);
        }
        return false;
    }
    ssize_t read(char * ptr, size_t size) override {
        if (is_readable()) {
            const size_t n = std::min(size, received_.size() - offset_);
            std::memcpy(ptr, received_.data() + offset_, n);
            offset_ += n;
            return static_cast<ssize_t>(n);
        }
        if (!wait_readable()) return -1;
        ssize_t n;
        do n = ::recv(sock_, ptr, size, 0);
        while (n < 0 && errno == EINTR);
        return n;
    }
    ssize_t write(const char * ptr, size_t size) override {
        wrote_ = true;
        const size_t early = std::min(size, sent_early_);  // client_gone() sent these bytes already
        sent_early_ -= early;
        if (early == size) return static_cast<ssize_t>(size);
        if (!wait_writable()) return -1;
        const ssize_t n = ::send(sock_, ptr + early, size - early, MSG_NOSIGNAL);
        return n < 0 ? n : n + static_cast<ssize_t>(early);
    }
    void get_remote_ip_and_port(std::string & ip, int & port) const override {
        sockaddr_storage a{};
        socklen_t len = sizeof a;
        if (::getpeername(sock_, reinterpret_cast<sockaddr *>(&a), &len) == 0) address_of(a, ip, port);
    }
    void get_local_ip_and_port(std::string & ip, int & port) const override {
        sockaddr_storage a{};
        socklen_t len = sizeof a;
        if (::getsockname(sock_, reinterpret_cast<sockaddr *>(&a), &len) == 0) address_of(a, ip, port);
    }
    socket_t socket() const override { return sock_; }
    Clock::time_point read_deadline() const { return read_deadline_; }
    time_t duration() const override { return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start_).count(); }
    const char * buffered_data(size_t & size) const override {
        size = received_.size() - offset_;
        return size ? received_.data() + offset_ : nullptr;
    }
    void consume_buffered(size_t size) override { offset_ += size; }
    // What the waiting room received past this request: the start of a pipelined next one.
    std::string unread() const { return received_.substr(offset_); }

private:
    const socket_t sock_;
    const std::string received_;
    size_t offset_ = 0;
    const Clock::time_point read_deadline_;
    const std::atomic<bool> & cut_;
    const std::chrono::milliseconds write_timeout_;
    const Clock::time_point start_;
    static constexpr char kResponseStart[] = "HTTP/1.1 ";
    mutable bool wrote_ = false;     // write() was called: the response has begun
    mutable size_t sent_early_ = 0;  // bytes of kResponseStart client_gone() sent that write() skips
};

thread_local const ConnectionStream * stream_on_this_thread = nullptr;

// Closes after the response: first the sending side, then, after reading briefly what the client
// still sends (a body not read), the socket, so that the close resets no response in flight.
void close_gently(socket_t sock) {
    ::shutdown(sock, SHUT_WR);
    const auto until = Clock::now() + std::chrono::milliseconds(100);
    char buffer[16384];
    size_t total = 0;
    while (total < (1u << 20) && wait_for(sock, POLLIN, remaining_ms(until))) {
        const ssize_t n = ::recv(sock, buffer, sizeof buffer, MSG_DONTWAIT);
        if (n <= 0) break;
        total += static_cast<size_t>(n);
    }
    ::close(sock);
}

}  // namespace

GatedServer::GatedServer(int max_connections, RequestDeadlines deadlines, std::function<std::string(int, const std::string &)> error_body)
    : max_connections_(max_connections), deadlines_(deadlines), error_body_(std::move(error_body)) {
    if (max_connections_ < 1) throw Error("the connection limit must be at least 1");
    if (deadlines_.head.count() <= 0 || deadlines_.request < deadlines_.head) {
        throw Error("the request deadline must be at least the head deadline, and both positive");
    }
    if (::pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) throw Error(std::string("cannot make the waiting room's pipe: ") + std::strerror(errno));
    new_task_queue = [] { return new HandOver; };
    // Every admitted connection gets a thread at once (no queue behind a long generation): at most
    // one per open connection. The threads a burst added stay a minute once idle (cpp-httplib's
    // default ends them after 3 s), so that the next burst reuses them rather than start new ones.
    const size_t max_threads = static_cast<size_t>(max_connections_);
    workers_ = std::make_unique<httplib::ThreadPool>(std::min<size_t>(8, max_threads), max_threads, 0, 60);
    // A kept-alive connection waits for its next request in the waiting room for up to the head
    // deadline, as the Keep-Alive header says; cpp-httplib says "Connection: close" on errors.
    keep_alive_timeout_sec_ = std::max<time_t>(1, std::chrono::duration_cast<std::chrono::seconds>(deadlines_.head).count());
    set_post_routing_handler([](const httplib::Request &, httplib::Response & res) {
        response_closes = res.get_header_value("Connection") == "close";
    });
    waiting_room_ = std::thread([this] { waiting_room(); });
}

GatedServer::~GatedServer() {
    stop_accepting();
    join_workers();
    ::close(wake_pipe_[0]);
    ::close(wake_pipe_[1]);
}

bool GatedServer::serve() { return listen_after_bind(); }

void GatedServer::stop_accepting() {
    stop();  // the listening socket
    {
        std::lock_guard lock(mutex_);
        accepting_ = false;
    }
    wake_waiting_room();
    if (waiting_room_.joinable()) waiting_room_.join();
}

bool GatedServer::wait_idle(Clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    return idle_.wait_until(lock, deadline, [this] { return serving_ == 0; });
}

void GatedServer::join_workers() {
    if (workers_) workers_->shutdown();
}

bool GatedServer::request_timed_out() { return timed_out_on_this_thread; }

bool GatedServer::client_gone() { return stream_on_this_thread && stream_on_this_thread->client_gone(); }

Clock::time_point GatedServer::request_deadline() { return stream_on_this_thread ? stream_on_this_thread->read_deadline() : Clock::time_point::max(); }

std::string GatedServer::deadline_text() const { return seconds_text(deadlines_.request); }

// On the accept loop's thread (HandOver): counts the connection and parks it in the waiting room.
bool GatedServer::process_and_close_socket(socket_t sock) {
    if (open_.fetch_add(1) >= max_connections_) {
        // Idle kept-alive connections give way to new clients: the waiting room closes the
        // longest idle one, so that they can never hold every connection.
        std::lock_guard lock(mutex_);
        if (idle_kept_ - evictions_ <= 0) {
            refuse(sock, 503, "the server has " + std::to_string(max_connections_) + " connections open, its limit (serve --max-connections)");
            closed();
            return false;
        }
        ++evictions_;
    }
    {
        std::lock_guard lock(mutex_);
        if (!accepting_) {
            ::close(sock);
            open_--;
            return false;
        }
        arrived_.push_back(std::make_unique<Waiting>(Waiting{sock, Clock::now(), {}}));
    }
    wake_waiting_room();
    return true;
}

void GatedServer::wake_waiting_room() {
    const char byte = 0;
    [[maybe_unused]] const ssize_t n = ::write(wake_pipe_[1], &byte, 1);  // a full pipe already wakes it
}

// Reads the waiting connections' heads as their bytes come. It receives them (rather than peeking
// with MSG_PEEK): a socket whose unread bytes stay in the kernel would keep poll() waking at once.
void GatedServer::waiting_room() {
    std::vector<std::unique_ptr<Waiting>> waiting;
    std::vector<pollfd> fds;
    for (;;) {
        {
            std::lock_guard lock(mutex_);
            for (auto & c : arrived_) {
                if (c->head.find("\r\n\r\n") != std::string::npos) {
                    admit_locked(std::move(c));  // a pipelined request, already whole
                } else {
                    idle_kept_ += c->idle;
                    waiting.push_back(std::move(c));
                }
            }
            arrived_.clear();
            if (!accepting_) break;
            // The longest idle first: they are in the order they came back.
            for (auto it = waiting.begin(); evictions_ > 0 && it != waiting.end();) {
                if (!(*it)->idle) {
                    ++it;
                    continue;
                }
                ::close((*it)->sock);
                closed();
                --idle_kept_;
                --evictions_;
                it = waiting.erase(it);
            }
            evictions_ = std::min(evictions_, idle_kept_);  // a connection counted idle had a request come meanwhile
        }
        Clock::time_point next_deadline = Clock::now() + std::chrono::seconds(60);
        fds.assign(1, pollfd{wake_pipe_[0], POLLIN, 0});
        for (auto & c : waiting) {
            fds.push_back(pollfd{c->sock, POLLIN, 0});
            next_deadline = std::min(next_deadline, c->accepted + deadlines_.head);
        }
        ::poll(fds.data(), fds.size(), remaining_ms(next_deadline));  // EINTR: as a timeout
        if (fds[0].revents) {
            char drain[64];
            while (::read(wake_pipe_[0], drain, sizeof drain) > 0) {}
        }
        const Clock::time_point now = Clock::now();
        std::vector<std::unique_ptr<Waiting>> still;
        for (size_t i = 0; i < waiting.size(); ++i) {
            std::unique_ptr<Waiting> & c = waiting[i];
            if (fds[i + 1].revents) {
                const size_t before = c->head.size();
                c->head.resize(kMaxHeadBytes);
                const ssize_t n = ::recv(c->sock, c->head.data() + before, kMaxHeadBytes - before, MSG_DONTWAIT);
                c->head.resize(before + std::max<ssize_t>(n, 0));
                const bool gone = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
                if (c->idle && (gone || n > 0)) {
                    // A kept-alive connection's next request: its deadlines run from its first byte.
                    std::lock_guard lock(mutex_);
                    c->idle = false;
                    --idle_kept_;
                    evictions_ = std::min(evictions_, idle_kept_);
                    c->accepted = now;
                }
                if (gone) {  // the client went away
                    ::close(c->sock);
                    closed();
                    continue;
                }
                if (c->head.find("\r\n\r\n", before >= 3 ? before - 3 : 0) != std::string::npos) {
                    admit(std::move(c));
                    continue;
                }
                if (c->head.size() >= kMaxHeadBytes) {
                    refuse(c->sock, 431, "the request's head (request line and headers) is longer than " + std::to_string(kMaxHeadBytes) + " bytes");
                    closed();
                    continue;
                }
            }
            if (now >= c->accepted + deadlines_.head) {
                if (c->idle) {  // no next request: closed as the Keep-Alive header announced, with no response
                    std::lock_guard lock(mutex_);
                    --idle_kept_;
                    evictions_ = std::min(evictions_, idle_kept_);
                    ::close(c->sock);
                } else {
                    refuse(c->sock, 408, "the request's head did not arrive within " + seconds_text(deadlines_.head));
                }
                closed();
                continue;
            }
            still.push_back(std::move(c));
        }
        waiting = std::move(still);
    }
    for (auto & c : waiting) {
        ::close(c->sock);
        closed();
    }
    std::lock_guard lock(mutex_);
    idle_kept_ = evictions_ = 0;
}

namespace {

// A request line's method and path ("POST /v1/completions"), at most 100 bytes, each byte that is
// not printable ASCII as '?': for a line on stderr.
std::string request_name(const std::string & head) {
    std::string line = head.substr(0, std::min({head.find("\r\n"), head.rfind(" HTTP/"), size_t(100)}));
    for (char & ch : line) ch = ch >= ' ' && ch < 0x7f ? ch : '?';
    return line;
}

}  // namespace

void GatedServer::admit(std::unique_ptr<Waiting> connection) {
    std::lock_guard lock(mutex_);
    admit_locked(std::move(connection));
}

void GatedServer::admit_locked(std::unique_ptr<Waiting> connection) {
    ++serving_;
    const auto served = served_.insert(served_.end(), Served{request_name(connection->head), Clock::now()});
    std::shared_ptr<Waiting> c(std::move(connection));
    auto done = [this, served] {
        std::lock_guard lock(mutex_);
        served_.erase(served);
        if (--serving_ == 0) idle_.notify_all();
    };
    const bool queued = workers_->enqueue([this, c, done] {
        timed_out_on_this_thread = false;
        response_closes = false;
        ConnectionStream stream(c->sock, std::move(c->head), c->accepted + deadlines_.request, reads_cut_,
                                std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::seconds(write_timeout_sec_) + std::chrono::microseconds(write_timeout_usec_)));
        stream_on_this_thread = &stream;
        std::string remote_ip, local_ip;
        int remote_port = 0, local_port = 0;
        stream.get_remote_ip_and_port(remote_ip, remote_port);
        stream.get_local_ip_and_port(local_ip, local_port);
        // A connection kept alive waits for its next request back in the waiting room, never on
        // this thread, so an idle or slow client holds a socket there as a new one does.
        const bool last = ++c->served >= keep_alive_max_count_;
        bool connection_closed = false;
        const bool answered = serve_guarded(
            [&] { return process_request(stream, remote_ip, remote_port, local_ip, local_port, last, connection_closed, nullptr); });
        stream_on_this_thread = nullptr;
        bool kept = answered && !connection_closed && !last && !response_closes && !timed_out_on_this_thread;
        if (kept) {
            std::lock_guard lock(mutex_);
            kept = accepting_;
            if (kept) arrived_.push_back(std::make_unique<Waiting>(Waiting{c->sock, Clock::now(), stream.unread(), true, c->served}));
        }
        if (kept) {
            wake_waiting_room();
        } else {
            close_gently(c->sock);
            closed();
        }
        done();
    });
    if (!queued) {  // the workers are shutting down
        ::close(c->sock);
        closed();
        served_.erase(served);  // under mutex_ already
        if (--serving_ == 0) idle_.notify_all();
    }
}

std::vector<std::string> GatedServer::in_flight() {
    std::lock_guard lock(mutex_);
    std::vector<std::string> names;
    for (const Served & s : served_) names.push_back(s.request + " (" + seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - s.since)) + ")");
    return names;
}

void GatedServer::refuse(socket_t sock, int status, const std::string & message) {
    const std::string body = error_body_(status, message);
    const std::string response = "HTTP/1.1 " + std::to_string(status) + ' ' + httplib::status_message(status) +
                                 "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                                 "\r\nConnection: close\r\n\r\n" + body;
    [[maybe_unused]] const ssize_t n = ::send(sock, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    // What the client sent and no one read would make the close a reset, which can overtake the response.
    char buffer[16384];
    while (::recv(sock, buffer, sizeof buffer, MSG_DONTWAIT) > 0) {}
    ::shutdown(sock, SHUT_WR);
    ::close(sock);
}

void GatedServer::closed() { open_--; }

}  // namespace specula
