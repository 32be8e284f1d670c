// Job's text pipeline (its class is in server/scheduler.h): the tokens a sequence emits go through
// the request's stop strings as they are emitted (take, in the sequence's sink, so the sequence
// stops at the token a stop string ends in), then, once their round says where each came from
// (publish), their released text is attributed to them token by token, cut into whole UTF-8
// characters and handed to the consumer with each fully released token's logprobs.
#include "server/scheduler.h"

namespace specula {

Job::Wait Job::next(std::string & text, std::vector<TokenOrigin> * origins, std::vector<TokenLogprob> * logprobs,
                    std::chrono::milliseconds timeout, std::vector<int32_t> * ids, std::vector<PromptProgress> * progress) {
    std::unique_lock lock(mutex_);
    const auto reported = [&] { return progress && !pending_progress_.empty(); };
    cv_.wait_for(lock, timeout, [&] { return !pending_.empty() || !pending_logprobs_.empty() || !pending_ids_.empty() || reported() || finished_; });
    if (reported()) {  // before the text that follows them
        progress->insert(progress->end(), pending_progress_.begin(), pending_progress_.end());
        pending_progress_.clear();
        if (pending_.empty() && pending_logprobs_.empty() && pending_ids_.empty()) return Wait::Text;
    }
    if (!pending_.empty() || !pending_logprobs_.empty() || !pending_ids_.empty()) {
        text += pending_;
        pending_.clear();
        if (ids) ids->insert(ids->end(), pending_ids_.begin(), pending_ids_.end());
        pending_ids_.clear();
        if (origins) origins->insert(origins->end(), pending_origins_.begin(), pending_origins_.end());
        pending_origins_.clear();
        if (logprobs) logprobs->insert(logprobs->end(), pending_logprobs_.begin(), pending_logprobs_.end());
        pending_logprobs_.clear();
        return Wait::Text;
    }
    return finished_ ? Wait::Ended : Wait::Idle;
}

GenerationStats Job::progress() const {
    std::lock_guard lock(mutex_);
    return progress_;
}

bool Job::take(int32_t id, const std::string & piece, std::optional<TokenLogprob> logprob) {
    if (!limits_.any()) {
        round_.push_back({id, piece.size(), stops_.empty() ? piece : stops_.push(piece), std::move(logprob)});
        return !stops_.stopped();
    }
    std::string text = piece;
    const bool within = within_limits(text);
    round_.push_back({id, text.size(), stops_.empty() ? text : stops_.push(text), std::move(logprob)});
    return within && !stops_.stopped();
}

bool Job::within_limits(std::string & text) {
    const auto now = std::chrono::steady_clock::now();
    if (tokens_taken_++ == 0) {
        first_token_at_ = now;
        if (limits_.max_prompt.count() > 0 && now - admitted_at_ > limits_.max_prompt) return !(limited_ = true);
    }
    if (limits_.n_indent > 0) {
        for (size_t i = 0; i < text.size(); ++i) {
            const char c = text[i];
            if (c == '\n') {
                ++newlines_, line_blanks_ = 0, line_indent_known_ = false;
            } else if (newlines_ == 0 || line_indent_known_) {
                continue;  // the first line is the cursor's, whatever its indentation
            } else if (c == ' ' || c == '\t') {
                ++line_blanks_;
            } else {
                line_indent_known_ = true;
                if (line_blanks_ < limits_.n_indent) {
                    text.resize(i);
                    return !(limited_ = true);
                }
            }
        }
    }
    if (limits_.max_predict.count() > 0 && text.find('\n') != std::string::npos && now - first_token_at_ > limits_.max_predict) {
        return !(limited_ = true);
    }
    return true;
}

void Job::publish(const std::function<std::pair<const char *, int>(size_t)> & origin_of, const GenerationStats & stats) {
    std::lock_guard lock(mutex_);
    progress_.n_prompt = stats.n_prompt, progress_.n_cached = stats.n_cached, progress_.prompt_seconds = stats.prompt_seconds;
    progress_.n_generated = stats.n_generated, progress_.generation_seconds = stats.generation_seconds;
    for (size_t i = 0; i < round_.size(); ++i) {
        const auto [kind, depth] = origin_of(i);
        held_.push_back({round_[i].id, round_[i].bytes, std::move(round_[i].logprob), kind, depth});
        release(round_[i].released);
    }
    round_.clear();
    cv_.notify_all();
}

void Job::release(const std::string & text) {
    size_t at = 0;
    for (;;) {
        // Tokens whose text has all been released are the consumer's, with their logprobs.
        while (!held_.empty() && held_.front().bytes == 0) {
            if (held_.front().logprob) pending_logprobs_.push_back(std::move(*held_.front().logprob));
            pending_ids_.push_back(held_.front().id);
            held_.pop_front();
        }
        if (at == text.size() || held_.empty()) return;
        Held & h = held_.front();
        const size_t n = std::min(h.bytes, text.size() - at);
        // A token ending inside a character hands its bytes to the next one (utf8_).
        const std::string complete = utf8_.push(text.substr(at, n));
        partial_origin_ = {"", h.kind, h.depth};
        if (!complete.empty()) {
            pending_ += complete;
            pending_origins_.push_back({complete, h.kind, h.depth});
        }
        h.bytes -= n;
        at += n;
    }
}

void Job::report_prompt(int total, int cache, int processed) {
    std::lock_guard lock(mutex_);
    if (prompt_in_) return;
    if (!prompt_started_) {
        pending_progress_.push_back({total, cache, cache, 0.0});
        prompt_started_ = true;
        processed_ = cache;
    }
    if (processed > processed_) {
        pending_progress_.push_back({total, cache, processed, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - admitted_at_).count()});
        processed_ = processed;
    }
    prompt_in_ = processed >= total;
    cv_.notify_all();
}

void Job::finish(Result result) {
    std::lock_guard lock(mutex_);
    if (stops_.stopped()) result.finish_reason = "stop";
    else release(stops_.flush());  // the end of the text that could have begun a stop string is text
    if (stops_.stopped()) result.stop_type = "word", result.stopping_word = stops_.matched();
    else result.stop_type = result.finish_reason == "stop" && !limited_ ? "eos" : "limit";
    const std::string rest = utf8_.flush();  // an unfinished character at the end is what the model produced
    if (!rest.empty()) pending_origins_.push_back({rest, partial_origin_.kind, partial_origin_.depth});
    pending_ += rest;
    result_ = std::move(result);
    finished_ = true;
    cv_.notify_all();
}

}  // namespace specula
