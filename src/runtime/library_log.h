#pragma once
// The log output of ggml and libllama. Silenced unless SPECULA_VERBOSE is set (their info lines are
// noise for users); error-level text is kept instead of printed, so that the one
// `specula: error:` line that ends a run gives their reason rather than following their lines.
#include <string>

namespace specula {

// Installs the logger for both libraries; idempotent. Called before their first call that may log.
void capture_library_log();
// The error-level text logged since the last call, on one line; empty if none (or when
// SPECULA_VERBOSE prints it instead).
std::string take_library_errors();

}  // namespace specula
