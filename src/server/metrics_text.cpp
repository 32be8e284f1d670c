#include "server/metrics_text.h"

#include <sstream>

namespace specula {

using nlohmann::json;

namespace {

// One Prometheus metric: its help and type lines, then its value, under `prefix` (specula: or llamacpp:).
template <typename Value>
void write_metric(std::ostringstream & o, const char * prefix, const char * name, const char * type, const char * help, Value value) {
    o << "# HELP " << prefix << name << ' ' << help << "\n# TYPE " << prefix << name << ' ' << type << '\n'
      << prefix << name << ' ' << value << '\n';
}

// The same counters under llama-server's names and meanings (its `llamacpp:` metrics), for the
// dashboards and alerts written for it: prompt tokens without the cached ones, embeddings' inputs
// among them, decodes as steps (one target forward each, drafts verified in it) and embeddings'
// forwards, the busy slots averaged over the steps.
void llama_server_metrics(std::ostringstream & o, const SchedulerMetrics & m) {
    auto metric = [&](const char * name, const char * type, const char * help, auto value) { write_metric(o, "llamacpp:", name, type, help, value); };
    auto rate = [](uint64_t n, double seconds) { return seconds > 0 ? static_cast<double>(n) / seconds : 0.0; };
    const uint64_t prefilled = m.prompt_tokens - m.prompt_tokens_cached + m.embedding_tokens;
    const double prompt_seconds = m.prompt_seconds + m.embedding_seconds;
    uint64_t busy = 0;
    for (size_t k = 0; k < m.busy_slots_steps.size(); ++k) busy += (k + 1) * m.busy_slots_steps[k];
    metric("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens", prefilled);
    metric("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache", m.prompt_tokens_cached);
    metric("prompt_seconds_total", "counter", "Total time spent processing prompts", prompt_seconds);
    metric("tokens_predicted_total", "counter", "Number of generation tokens processed", m.generated_tokens);
    metric("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens", m.generation_seconds);
    metric("n_decode_total", "counter", "Target forwards (scheduler steps, drafts verified in them, and embeddings')", m.steps + m.embedding_forwards);
    metric("n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)", m.longest_sequence);
    metric("spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated", m.draft_tokens);
    metric("spec_decode_num_accepted_tokens_total", "counter", "Speculative: Total draft tokens accepted by the target model", m.accepted_tokens);
    metric("spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding verification steps", m.drafts);
    metric("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s", rate(prefilled, prompt_seconds));
    metric("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s", rate(m.generated_tokens, m.generation_seconds));
    metric("requests_processing", "gauge", "Number of requests processing", m.processing);
    metric("requests_deferred", "gauge", "Number of requests deferred", m.deferred);
    metric("n_busy_slots_per_decode", "gauge", "Average number of busy slots per target forward", m.steps ? static_cast<double>(busy) / m.steps : 0.0);
}

}  // namespace

std::string prometheus(const SchedulerMetrics & m) {
    std::ostringstream o;
    auto metric = [&](const char * name, const char * type, const char * help, auto value) { write_metric(o, "specula:", name, type, help, value); };
    metric("requests_processing", "gauge", "Requests in slots.", m.processing);
    metric("requests_deferred", "gauge", "Requests waiting for a slot.", m.deferred);
    metric("requests_finished_total", "counter", "Requests completed.", m.requests_finished);
    metric("requests_cancelled_total", "counter", "Requests whose client went away.", m.requests_cancelled);
    metric("requests_failed_total", "counter", "Requests that failed.", m.requests_failed);
    metric("prompt_tokens_total", "counter", "Prompt tokens processed.", m.prompt_tokens);
    metric("prompt_tokens_cached_total", "counter", "Of the prompt tokens, those served from a slot's prefix cache (not prefilled).",
           m.prompt_tokens_cached);
    metric("prompt_seconds_total", "counter", "Prompt processing time.", m.prompt_seconds);
    metric("tokens_predicted_total", "counter", "Tokens generated.", m.generated_tokens);
    metric("tokens_predicted_seconds_total", "counter", "Generation time.", m.generation_seconds);
    metric("steps_total", "counter", "Scheduler steps (one target forward each).", m.steps);
    metric("embedding_tokens_total", "counter", "Embeddings' input tokens.", m.embedding_tokens);
    metric("embedding_forwards_total", "counter", "Target forwards that computed embeddings.", m.embedding_forwards);
    metric("gated_steps_total", "counter", "Decoding steps in which the speculation gate allowed no drafts (plain steps measured faster at that load).",
           m.gated_steps);
    o << "# HELP specula:verify_batch_rows Rows of the target forward per step.\n# TYPE specula:verify_batch_rows histogram\n";
    for (size_t b = 0; b < m.rows_buckets.size(); ++b) {
        o << "specula:verify_batch_rows_bucket{le=\"" << (b < m.rows_bounds.size() ? json(m.rows_bounds[b]).dump() : "+Inf") << "\"} "
          << m.rows_buckets[b] << '\n';
    }
    o << "specula:verify_batch_rows_sum " << m.rows_sum << "\nspecula:verify_batch_rows_count " << m.steps << '\n';
    o << "# HELP specula:busy_slots_steps_total Steps by the number of sequences in the forward.\n# TYPE specula:busy_slots_steps_total counter\n";
    for (size_t k = 0; k < m.busy_slots_steps.size(); ++k) o << "specula:busy_slots_steps_total{slots=\"" << k + 1 << "\"} " << m.busy_slots_steps[k] << '\n';
    metric("spec_decode_num_drafts_total", "counter", "Rounds that verified a non-empty draft.", m.drafts);
    metric("spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.", m.draft_tokens);
    metric("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", m.accepted_tokens);
    const SuffixCache::Stats & suffix = m.suffix_cache;
    metric("suffix_cache_drafts_total", "counter", "Drafts looked up in earlier requests' text (the suffix cache).", suffix.drafts);
    metric("suffix_cache_draft_tokens_total", "counter", "Tokens of those drafts.", suffix.draft_tokens);
    metric("suffix_cache_accepted_tokens_total", "counter", "Of those tokens, the ones verification accepted in the round after.",
           suffix.accepted_tokens);
    metric("suffix_cache_tokens", "gauge", "Tokens of earlier requests the suffix cache keeps.", suffix.tokens);
    metric("suffix_cache_evicted_total", "counter", "Earlier requests evicted from the suffix cache to keep it bounded.", suffix.evicted);
    const PrefixStore::Stats & store = m.prefix_store;
    metric("prefix_store_bytes", "gauge", "Host bytes of the prefix store (slots' rows kept for later requests).", store.bytes);
    metric("prefix_store_entries", "gauge", "Prefixes the prefix store keeps.", store.entries);
    metric("prefix_store_hits_total", "counter", "Requests whose prompt's prefix was copied from the prefix store.", store.hits);
    metric("prefix_store_evictions_total", "counter", "Prefixes evicted from the prefix store to keep it within --cache-bytes.",
           store.evictions);
    metric("graphs_kept", "gauge", "Forward graphs kept for reuse, one per batch shape (at most 32 per model).", m.graphs_kept);
    metric("graph_buffer_bytes", "gauge",
           "Host bytes of the compute buffers of the forward graphs kept for reuse (at most 32 shapes per model, the largest seen so far).",
           m.graph_buffer_bytes);
    o << "# HELP specula:spec_decode_num_accepted_tokens_per_pos_total Accepted draft tokens by depth.\n"
         "# TYPE specula:spec_decode_num_accepted_tokens_per_pos_total counter\n";
    for (size_t d = 0; d < m.accepted_at.size(); ++d) {
        o << "specula:spec_decode_num_accepted_tokens_per_pos_total{position=\"" << d << "\"} " << m.accepted_at[d] << '\n';
    }
    llama_server_metrics(o, m);
    return o.str();
}
// The figures the live page shows, as JSON (the Prometheus text's twin for a browser).
json metrics_json(const SchedulerMetrics & m) {
    return json{{"slots", m.slots},
                {"requests_processing", m.processing},
                {"requests_deferred", m.deferred},
                {"requests_finished", m.requests_finished},
                {"emitted_tokens", m.emitted_tokens},
                {"steps", m.steps},
                {"drafts", m.drafts},
                {"draft_tokens", m.draft_tokens},
                {"accepted_tokens", m.accepted_tokens},
                {"acceptance_rate", m.draft_tokens ? double(m.accepted_tokens) / m.draft_tokens : 0.0},
                // Tokens per drafting round: its accepted drafts plus the target's own token.
                {"mean_accepted_length", m.drafts ? double(m.accepted_tokens + m.drafts) / m.drafts : 0.0}};
}

}  // namespace specula
