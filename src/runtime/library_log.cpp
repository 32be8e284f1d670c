#include "runtime/library_log.h"

#include <cstdlib>
#include <mutex>

#include "llama.h"

namespace specula {

namespace {
std::mutex g_mutex;
std::string g_errors;  // error-level text since the last take_library_errors()
}  // namespace

void capture_library_log() {
    static std::once_flag once;
    std::call_once(once, [] {
        if (std::getenv("SPECULA_VERBOSE")) return;
        llama_log_set([](ggml_log_level level, const char * text, void *) {  // ggml's logger too
            if (level != GGML_LOG_LEVEL_ERROR) return;
            std::lock_guard lock(g_mutex);
            g_errors += text;
        },
                      nullptr);
    });
}

std::string take_library_errors() {
    std::lock_guard lock(g_mutex);
    std::string text;
    for (char c : g_errors) text += c == '\n' ? ' ' : c;
    g_errors.clear();
    while (!text.empty() && text.back() == ' ') text.pop_back();
    return text;
}

}  // namespace specula
