#include "server/choices.h"

#include <chrono>

#include "server/gated_server.h"
#include "server/http_reply.h"
#include "server/openai_chat.h"
#include "server/openai_logprobs.h"

namespace specula {

using nlohmann::json;

namespace {

void cancel_all(const std::vector<std::shared_ptr<Job>> & jobs) {
    for (const auto & job : jobs) job->cancel();
}

// The first choice's statistics with every choice's completion tokens and every prompt's tokens
// (each prompt's first choice has them; `n` choices a prompt).
GenerationStats summed(const std::vector<std::shared_ptr<Job>> & jobs, size_t n) {
    GenerationStats stats = jobs[0]->result().stats;
    for (size_t i = 1; i < jobs.size(); ++i) {
        const GenerationStats & other = jobs[i]->result().stats;
        stats.n_generated += other.n_generated;
        if (i % n == 0) stats.n_prompt += other.n_prompt, stats.n_cached += other.n_cached;
    }
    return stats;
}

json with_index(json chunk, size_t i) {
    if (chunk.contains("choices")) chunk["choices"][0]["index"] = i;
    else chunk["index"] = i;  // llama-server's /completion
    return chunk;
}

const Job & leader_of(const std::vector<std::shared_ptr<Job>> & jobs, const openai::Completion & c, size_t i) { return *jobs[i - i % c.n]; }

}  // namespace

openai::ApiError job_error(const Job::Result & result) {
    if (result.client_error) return openai::ApiError{400, result.error, "invalid_request_error", "", ""};
    return openai::ApiError{500, result.error, "server_error", "", ""};
}

json choice_logprobs(const openai::Completion & c, const Job & leader, const std::vector<TokenLogprob> & tokens) {
    size_t text_offset = 0;
    if (!c.echo_logprobs) return openai::logprobs(c, tokens, text_offset);
    json j = openai::prompt_logprobs(c, leader.prompt(), leader.result().prompt_logprobs, text_offset);
    openai::append_logprobs(j, openai::logprobs(c, tokens, text_offset));
    return j;
}

void respond_choices_whole(httplib::Response & res, const std::vector<std::shared_ptr<Job>> & jobs,
                           const openai::Completion & c, const std::shared_ptr<const ChatPrompt> & parsed_as, const std::atomic<bool> & ending) {
    std::vector<std::string> texts(jobs.size());
    std::vector<std::vector<TokenLogprob>> logprobs(jobs.size());
    std::vector<openai::ChoiceEnd> ends(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
        while (jobs[i]->next(texts[i], nullptr, c.token_text ? &logprobs[i] : nullptr, std::chrono::milliseconds(200), &ends[i].tokens) != Job::Wait::Ended) {
            if (ending) {
                cancel_all(jobs);
                return send_error(res, shutting_down_error());
            }
            if (GatedServer::client_gone()) return cancel_all(jobs);  // nobody reads the answer
        }
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
        const Job::Result & result = jobs[i]->result();
        if (!result.error.empty()) return send_error(res, job_error(result));
        ends[i].stop_type = result.stop_type, ends[i].stopping_word = result.stopping_word;
    }
    if (c.endpoint == openai::Endpoint::Llama) {
        json answers = json::array();
        for (size_t i = 0; i < jobs.size(); ++i) {
            answers.push_back(openai::response(c, texts[i], jobs[i]->result().finish_reason, jobs[i]->result().stats, i, ends[i]));
            if (c.token_text) answers.back()["completion_probabilities"] = choice_logprobs(c, *jobs[i], logprobs[i])["content"];
        }
        return send_json(res, 200, answers);
    }
    json response = openai::response(c, texts[0], jobs[0]->result().finish_reason, summed(jobs, c.n), 0, ends[0]);
    if (c.verbose) response["__verbose"] = json::array();  // one object per choice
    json choices = json::array();
    for (size_t i = 0; i < jobs.size(); ++i) {
        json whole = openai::response(c, texts[i], jobs[i]->result().finish_reason, jobs[i]->result().stats, i, ends[i]);
        if (c.verbose) response["__verbose"].push_back(std::move(whole["__verbose"]));
        json choice = std::move(whole["choices"][0]);
        if (c.token_text) choice["logprobs"] = choice_logprobs(c, leader_of(jobs, c, i), logprobs[i]);
        if (parsed_as) {
            json one = {{"choices", json::array({std::move(choice)})}};
            openai::set_reply(one, ChatTemplate::parse(*parsed_as, texts[i], /*partial=*/false));
            choice = std::move(one["choices"][0]);
        }
        choices.push_back(std::move(choice));
    }
    response["choices"] = std::move(choices);
    send_json(res, 200, response);
}

void respond_choices_stream(httplib::Response & res, const std::vector<std::shared_ptr<Job>> & jobs, const openai::Completion & c,
                            const std::shared_ptr<const ChatPrompt> & parsed_as, bool include_usage, const std::atomic<bool> & ending) {
    res.set_header("Cache-Control", "no-cache");
    std::vector<std::shared_ptr<openai::ReplyStream>> replies(jobs.size());
    if (parsed_as) {
        for (auto & reply : replies) reply = std::make_shared<openai::ReplyStream>(*parsed_as);
    }
    res.set_chunked_content_provider(
        "text/event-stream",
        [jobs, c, replies, include_usage, &ending](size_t, httplib::DataSink & sink) {
            auto write = [&](const std::string & event) {
                if (sink.write(event.data(), event.size())) return true;
                cancel_all(jobs);  // the client went away: free the slots
                return false;
            };
            auto end_stream = [&](const json & error) {
                cancel_all(jobs);
                write(openai::sse(error));
                write("data: [DONE]\n\n");
                sink.done();
                return true;
            };
            const size_t n = jobs.size();
            for (size_t i = 0; c.endpoint != openai::Endpoint::Llama && i < n; ++i) {  // llama-server's /completion has no opening events
                if (!write(openai::sse(openai::chunk_start(c, i)))) return false;
            }
            std::vector<std::vector<TokenLogprob>> logprobs(n);
            std::vector<std::vector<int32_t>> ids(n);
            std::vector<size_t> text_offset(n, 0);
            // A choice's chunk with the logprobs (and llama-server's /completion: the ids) of its
            // tokens released since its last chunk, and with timings_per_token its figures so far.
            auto choice_chunk = [&](json chunk, size_t i) {
                chunk = with_index(std::move(chunk), i);
                if (c.endpoint == openai::Endpoint::Llama && chunk.value("stop", true) == false) chunk["tokens"] = ids[i];
                ids[i].clear();
                if (c.timings_per_token && !chunk.contains("timings")) chunk["timings"] = openai::timings(jobs[i]->progress());
                if (c.token_text && !logprobs[i].empty()) {
                    json values = openai::logprobs(c, logprobs[i], text_offset[i]);
                    if (c.endpoint == openai::Endpoint::Llama) chunk["completion_probabilities"] = std::move(values["content"]);
                    else chunk["choices"][0]["logprobs"] = std::move(values);
                }
                logprobs[i].clear();
                return openai::sse(chunk);
            };
            std::vector<char> ended(n, 0);
            size_t running = n;
            auto last_write = std::chrono::steady_clock::now();
            while (running > 0) {
                if (ending) return end_stream(shutting_down_error().body());
                bool wrote = false;
                for (size_t i = 0; i < n; ++i) {
                    if (ended[i]) continue;
                    std::string text;
                    std::vector<TokenOrigin> origins;
                    const auto wait = std::chrono::milliseconds(running == 1 ? 200 : 10);  // one waits, several are polled in turn
                    const Job::Wait w = jobs[i]->next(text, &origins, c.token_text ? &logprobs[i] : nullptr, wait, &ids[i]);
                    if (w == Job::Wait::Text && replies[i]) {
                        for (json & delta : replies[i]->add(text)) {
                            if (!write(choice_chunk(openai::chunk_delta(c, std::move(delta)), i))) return false;
                        }
                        wrote = true;
                    } else if (w == Job::Wait::Text) {
                        json tokens = json::array();
                        for (const TokenOrigin & o : origins) tokens.push_back({{"text", o.text}, {"kind", o.kind}, {"depth", o.depth}});
                        if (!write(choice_chunk(openai::chunk_text(c, text, tokens), i))) return false;
                        wrote = true;
                    } else if (w == Job::Wait::Ended) {
                        const Job::Result & result = jobs[i]->result();
                        if (!result.error.empty()) return end_stream(job_error(result).body());
                        if (replies[i]) {
                            std::vector<json> deltas;
                            replies[i]->finish("", &deltas);
                            for (json & delta : deltas) {
                                if (!write(choice_chunk(openai::chunk_delta(c, std::move(delta)), i))) return false;
                            }
                        }
                        // llama-server's /completion ends each prompt's stream with its whole answer's fields.
                        json last = c.endpoint == openai::Endpoint::Llama ? openai::response(c, "", result.finish_reason, result.stats, i, openai::ChoiceEnd{result.stop_type, result.stopping_word, {}})
                                                                          : openai::chunk_finish(c, result.finish_reason);
                        if (c.endpoint != openai::Endpoint::Llama) {
                            last["timings"] = openai::timings(result.stats);  // llama-server's, on the choice's last chunk
                            const openai::ChoiceEnd end{result.stop_type, result.stopping_word, {}};
                            if (c.verbose) last["__verbose"] = openai::llama_object(c, "", result.finish_reason, result.stats, end, true, i);
                        }
                        if (!write(choice_chunk(std::move(last), i))) return false;
                        ended[i] = 1;
                        --running;
                        wrote = true;
                    }
                }
                const auto now = std::chrono::steady_clock::now();
                if (wrote) {
                    last_write = now;
                } else if (now - last_write > std::chrono::milliseconds(200)) {
                    if (!sink.is_writable() || !write(": waiting\n\n")) return cancel_all(jobs), false;
                    last_write = now;
                }
            }
            if (include_usage && !write(openai::sse(openai::chunk_usage(c, summed(jobs, c.n))))) return false;
            write("data: [DONE]\n\n");
            sink.done();
            return true;
        },
        [jobs](bool) { cancel_all(jobs); });
}

}  // namespace specula
