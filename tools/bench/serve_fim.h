#pragma once
// `bench serve --fim DIR`: editor sessions replayed against POST /infill (server/infill.h), the
// requests llama.vscode and llama.vim send while a file is typed, against every configuration of
// serve_common.h (specula plain and speculative, llama-server plain and speculative).
#include "serve_bench.h"

namespace specula::bench {

// Per file of DIR (the first --fim-files in name order, each with siblings in DIR): --fim-lines of
// its lines typed one after another, a request at each line's end as llama.vim builds it (the
// prefix: up to 256 lines above, the current line as `prompt`, the suffix: up to 64 lines below,
// n_indent the line's indentation) with input_extra the first 32 lines of three sibling files,
// greedy, --fim-predict tokens at most, one editor (one slot). Per configuration: request latency
// (p50, p95, mean), prompt tokens evaluated per request (the server's timings.prompt_n: what its
// prompt cache did not hold) and tokens per target forward while generating.
int run_fim(ServeBenchOptions & o);

}  // namespace specula::bench
