#include "common/progress.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>

namespace specula {

namespace {
std::atomic<bool> g_quiet{false};

std::string duration(double seconds) {
    const long s = std::lround(std::max(0.0, seconds));
    char buf[32];
    if (s >= 3600) std::snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, s / 60 % 60);
    else if (s >= 60) std::snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
    else std::snprintf(buf, sizeof(buf), "%lds", s);
    return buf;
}
}  // namespace

void Progress::set_quiet(bool quiet) { g_quiet = quiet; }

Progress::Progress(std::string what, int64_t total)
    : what_(std::move(what)), total_(std::max<int64_t>(total, 1)), start_(std::chrono::steady_clock::now()), terminal_(isatty(STDERR_FILENO) != 0) {}

Progress::~Progress() {
    if (terminal_ && done_ > 0 && !g_quiet) std::fputc('\n', stderr);
}

void Progress::step(const std::string & detail) {
    ++done_;
    if (g_quiet) return;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double rate = elapsed > 0 ? done_ / elapsed : 0.0;
    const std::string eta = done_ < total_ && rate > 0 ? ", ETA " + duration((total_ - done_) / rate) : ", took " + duration(elapsed);
    const std::string tail = detail.empty() ? "" : " " + detail;
    if (terminal_) {
        constexpr int kWidth = 24;
        const int filled = static_cast<int>(kWidth * std::min(done_, total_) / total_);
        std::fprintf(stderr, "\r[specula] %s [%s%s] %lld/%lld, %.2f/s%s%s\x1b[K", what_.c_str(), std::string(filled, '#').c_str(),
                     std::string(kWidth - filled, '.').c_str(), static_cast<long long>(done_), static_cast<long long>(total_), rate,
                     eta.c_str(), tail.c_str());
    } else {
        std::fprintf(stderr, "[specula] %s: %lld/%lld%s%s\n", what_.c_str(), static_cast<long long>(done_), static_cast<long long>(total_),
                     tail.c_str(), eta.c_str());
    }
    std::fflush(stderr);
}

}  // namespace specula
