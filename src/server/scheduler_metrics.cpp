// Scheduler's counters: what a step adds to them, and the consistent copy metrics() returns.
#include "runtime/forward.h"
#include "server/scheduler_slot.h"

namespace specula {

SchedulerMetrics Scheduler::metrics() const {
    std::lock_guard lock(mutex_);
    SchedulerMetrics m = metrics_;
    if (suffix_cache_) m.suffix_cache = suffix_cache_->stats();
    if (store_) m.prefix_store = store_->stats();
    m.graph_buffer_bytes = ModelRunner::kept_graph_bytes_all();
    m.graphs_kept = ModelRunner::kept_graphs_all();
    m.failure = failure_;
    m.deferred = static_cast<int>(queue_.size());
    m.processing = 0;
    for (auto & slot : slots_) {
        m.processing += slot->published.busy;
        m.slot_states.push_back(slot->published);
    }
    return m;
}

void Scheduler::publish_slots() {
    for (auto & slot : slots_) {
        SchedulerMetrics::Slot & p = slot->published;
        p.busy = slot->job != nullptr;
        if (slot->job) p.tenant = slot->job->tenancy_.tenant;
        p.n_cached = slot->cache->size();
        p.n_prompt = slot->running() ? slot->stats().n_prompt : 0;
        p.n_generated = slot->running() ? slot->stats().n_generated : 0;
    }
}

void Scheduler::report_prompt_progress(Slot & slot) {
    if (!slot.job || !slot.running()) return;
    const GenerationStats & st = slot.stats();
    const bool prefilling = slot.sequence ? slot.sequence->prefilling() : slot.exit_sequence->prefilling();
    const int in_cache = slot.sequence ? slot.sequence->prefilled() : slot.exit_sequence->prefilled();
    slot.job->report_prompt(st.n_prompt, st.n_cached, prefilling ? in_cache : st.n_prompt);
}

void Scheduler::account_step(const std::vector<Slot *> & active, const std::vector<Slot *> & lossy, int busy, const StepResult & step,
                             int lossy_tokens, bool gated) {
    ++metrics_.steps;
    metrics_.gated_steps += gated;
    metrics_.emitted_tokens += step.tokens + lossy_tokens;
    metrics_.rows_sum += step.rows;
    if (!active.empty()) {
        for (size_t b = 0; b < metrics_.rows_buckets.size(); ++b) {
            if (b == metrics_.rows_bounds.size() || step.rows <= metrics_.rows_bounds[b]) ++metrics_.rows_buckets[b];
        }
    }
    ++metrics_.busy_slots_steps[busy - 1];
    for (Slot * s : lossy) {
        report_prompt_progress(*s);
        if (s->exit_sequence && s->exit_sequence->done()) release(*s, !s->job->cancelled());
    }
    for (Slot * s : active) {
        report_prompt_progress(*s);
        const SpeculationStats & now = s->sequence->stats().speculation;
        metrics_.draft_tokens += now.drafted - s->seen.drafted;
        metrics_.accepted_tokens += now.accepted - s->seen.accepted;
        if (metrics_.accepted_at.size() < now.accepted_at.size()) metrics_.accepted_at.resize(now.accepted_at.size(), 0);
        for (size_t d = 0; d < now.accepted_at.size(); ++d) {
            metrics_.accepted_at[d] += now.accepted_at[d] - (d < s->seen.accepted_at.size() ? s->seen.accepted_at[d] : 0);
        }
        const int drafts_now = now.reached_at.empty() ? 0 : now.reached_at[0];
        const int drafts_seen = s->seen.reached_at.empty() ? 0 : s->seen.reached_at[0];
        metrics_.drafts += drafts_now - drafts_seen;
        s->seen = now;
        if (s->sequence->done()) release(*s, !s->job->cancelled());
    }
}

}  // namespace specula
