#pragma once
// A request's n choices (Scheduler::submit_choices, choice i sampled with seed + i) answered as
// one response or one stream. Choice i is choices[i] with "index" i; a stream sends each choice's
// first chunk (its role, for chat), its text deltas and its last chunk (its finish_reason), each
// with the choice's index, the choices' chunks interleaved as their text comes. Usage counts the
// prompt once and sums the choices' completion tokens; its cached_tokens and `speculation` are
// the first choice's (the one that prefilled the prompt). A completions batch is its prompts' choices
// in order (choice k answers prompt k / c.n), its usage summing every prompt; llama-server's
// /completion answers a batch with an array of its objects. A client gone cancels every choice.
// `parsed_as`: each choice's reply parsed as this chat prompt's (reasoning; n > 1 is refused with
// tools), or null.
#include <httplib.h>

#include <atomic>
#include <memory>
#include <vector>

#include "server/openai.h"
#include "server/scheduler.h"
#include "tokenizer/chat_template.h"

namespace specula {

// A choice's logprobs object for `tokens`, its generated tokens' logprobs: with echo and logprobs
// (c.echo_logprobs) its prompt's first, from `leader`, the first choice of its prompt, which has ended.
nlohmann::json choice_logprobs(const openai::Completion & c, const Job & leader, const std::vector<TokenLogprob> & tokens);

// A failed job's answer: 400 when the request's own grammar could not go on (a limit, no token
// allowed), else 500.
openai::ApiError job_error(const Job::Result & result);

void respond_choices_whole(httplib::Response & res, const std::vector<std::shared_ptr<Job>> & jobs,
                           const openai::Completion & c, const std::shared_ptr<const ChatPrompt> & parsed_as, const std::atomic<bool> & ending);
void respond_choices_stream(httplib::Response & res, const std::vector<std::shared_ptr<Job>> & jobs, const openai::Completion & c,
                            const std::shared_ptr<const ChatPrompt> & parsed_as, bool include_usage, const std::atomic<bool> & ending);

}  // namespace specula
