#pragma once
// The HTTP server under `specula serve`: a cpp-httplib Server whose connections reach its worker
// threads only once their request head has arrived whole. A new connection waits in one poll()
// thread (the waiting room) until its head ends ("\r\n\r\n"), so a client that trickles its head
// a byte at a time holds a socket, never a thread; a head still incomplete past its deadline gets
// 408, one longer than the head limit 431. The head and body must have arrived by the request
// deadline (408 after it), and open connections are capped (more get 503). A connection kept
// alive goes back to the waiting room after each response, and idle there it gives way to a new
// connection past the cap, or is closed at the head deadline. For a graceful end:
// stop_accepting(), wait_idle() for the requests in flight, cut_reads(), join_workers().
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/http_server.h"

namespace specula {

class GatedServer final : public httplib::Server {
public:
    using Clock = std::chrono::steady_clock;

    // Request heads longer than this get 431 (cpp-httplib's own limits: 8 KiB a header line, 100 lines).
    static constexpr size_t kMaxHeadBytes = 16 << 10;

    // `error_body(status, message)`: the body (JSON) of the responses the gate itself sends.
    GatedServer(int max_connections, RequestDeadlines deadlines, std::function<std::string(int status, const std::string & message)> error_body);
    ~GatedServer() override;

    // Serves until stop_accepting() (true) or until the listener fails (false). Call after binding.
    bool serve();
    // Closes the listening socket and the connections still in the waiting room; the requests
    // being served go on.
    void stop_accepting();
    // Waits until no request is being served or until `deadline`; true when none is left.
    bool wait_idle(std::chrono::steady_clock::time_point deadline);
    // Ends the reads of the requests still sending their head or body (they answer 408): the
    // shutdown's end, which waits for no client.
    void cut_reads() { reads_cut_ = true; }
    // Joins the worker threads once stop_accepting() and the requests have ended.
    void join_workers();
    // The requests being served, each as its request line's method and path and how long it has
    // been served ("POST /v1/completions (12.5 s)"): what a shutdown that cannot end names.
    std::vector<std::string> in_flight();
    // The request on this thread timed out reading its head or body (for the error handler).
    static bool request_timed_out();
    // The client of the request on this thread closed its connection or reset it: nobody reads
    // the answer. A client that only shut its sending side (a half close) still reads: not gone.
    static bool client_gone();
    // The request deadline of the request on this thread (from its connection's accept, or its
    // first byte on a kept-alive one); time_point::max() off a served connection's thread.
    static Clock::time_point request_deadline();
    // The request deadline as error messages give it ("30 s").
    std::string deadline_text() const;

private:
    struct Waiting;
    bool process_and_close_socket(socket_t sock) override;
    void waiting_room();
    void wake_waiting_room();
    void admit(std::unique_ptr<Waiting> connection);         // to a worker thread
    void admit_locked(std::unique_ptr<Waiting> connection);  // the same, under mutex_
    void refuse(socket_t sock, int status, const std::string & message);
    void closed();  // a connection ended

    const int max_connections_;
    const RequestDeadlines deadlines_;
    const std::function<std::string(int, const std::string &)> error_body_;
    std::atomic<int> open_{0};  // connections accepted and not yet closed
    std::atomic<bool> reads_cut_{false};
    std::mutex mutex_;
    std::condition_variable idle_;
    int serving_ = 0;  // connections on worker threads (under mutex_)
    struct Served {
        std::string request;  // method and path, printable
        Clock::time_point since;
    };
    std::list<Served> served_;                       // under mutex_, one per connection on a worker thread
    int idle_kept_ = 0;                              // kept-alive connections in the waiting room with no next request yet (under mutex_)
    int evictions_ = 0;                              // of those, how many to close for new connections past the limit (under mutex_)
    std::vector<std::unique_ptr<Waiting>> arrived_;  // accepted, not yet in the waiting room (under mutex_)
    bool accepting_ = true;                          // under mutex_
    int wake_pipe_[2] = {-1, -1};
    std::thread waiting_room_;
    std::unique_ptr<httplib::ThreadPool> workers_;
};

}  // namespace specula
