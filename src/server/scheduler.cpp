#include "server/scheduler.h"

#include <algorithm>
#include <exception>
#include <future>

#include "specula/error.h"
#include "constrain/grammar_guard.h"
#include "engine/sequence.h"
#include "engine/model_bundle.h"
#include "engine/specee.h"
#include "runtime/backend.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "server/prefix_store.h"
#include "server/scheduler_slot.h"
#include "server/slot_prefix.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace specula {

Scheduler::Scheduler(ModelBundle & target, SchedulerOptions options) : target_(target), options_(options) {
    if (options.parallel < 1) throw Error("--parallel must be at least 1");
    if (options.max_queued < 0) throw Error("the queue size must not be negative");
    if (options.prefill_chunk < 1) throw Error("the prefill chunk must be at least 1 token");
    const int n_ctx = target.options.n_ctx;
    auto caches = KvCache::pool(*target.backend, target.model->config(), n_ctx, options.parallel);
    auto drafters = target.make_drafters(n_ctx, options.parallel);  // one group: a step's drafts run batched
    for (int i = 0; i < options.parallel; ++i) {
        auto slot = std::make_unique<Slot>();
        slot->id = i;
        slot->published.id = i;
        slot->cache = std::move(caches[i]);
        slot->drafter = std::move(drafters[i]);
        slots_.push_back(std::move(slot));
    }
    if (options.cache_bytes > 0) store_ = std::make_unique<PrefixStore>(options.cache_bytes);
    if (options.embeddings) start_embeddings();
    if (options.suffix_cache_tokens > 0) {
        const DrafterSpec & spec = target.drafter.spec;
        auto cache = std::make_shared<SuffixCache>(options.suffix_cache_tokens, spec.ngram_min, spec.ngram_max);
        bool looked_up = false;
        for (auto & slot : slots_) looked_up = (slot->drafter && slot->drafter->use_suffix_cache(cache, "")) || looked_up;
        if (looked_up) suffix_cache_ = std::move(cache);
    }
    std::vector<int32_t> probe = target.tokenizer->tokenize("The quick brown fox jumps over the lazy dog.");
    if (probe.empty()) probe.push_back(0);
    // Up to the rows of a step where every slot drafts its longest chain (capped: the probe runs
    // each size three times); larger steps extrapolate the curve. Measured on the worker thread,
    // like every forward of this target: with libgomp each thread that starts a parallel region
    // gets its own team, and two teams on a 2-core machine are more threads than CPUs, so libgomp's
    // barriers sleep instead of spinning (docs/server.md, "One thread computes").
    const int probe_rows = std::min(64, options.parallel * (target.options.draft_max + 1));

    if (options.gate_speculation && target.needs_verify_cost()) gate_ = std::make_unique<SpeculationGate>();
    metrics_.slots = options.parallel;
    metrics_.rows_bounds = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    metrics_.rows_buckets.assign(metrics_.rows_bounds.size() + 1, 0);
    metrics_.busy_slots_steps.assign(options.parallel, 0);

    std::promise<void> measured;
    std::future<void> ready = measured.get_future();
    worker_ = std::thread([this, measured = std::move(measured), probe = std::move(probe), probe_rows]() mutable {
        try {
            target_.measure_verify_cost_once(*slots_[0]->cache, probe, probe_rows);
        } catch (...) {
            measured.set_exception(std::current_exception());
            return;
        }
        measured.set_value();
        run();
    });
    try {
        ready.get();
    } catch (...) {
        worker_.join();
        throw;
    }
    // From here an rpc-server's failure ends the requests, not the process.
    if (target.backend->remote()) Backend::set_remote_failure_handler([this](const std::string & line) { fail_all(line); });
}

Scheduler::~Scheduler() {
    if (target_.backend->remote()) Backend::set_remote_failure_handler(nullptr);
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    cv_.notify_all();
    if (failed()) {
        worker_.detach();  // parked for good in the forward that met the failure
        return;            // its jobs have ended; its slots cannot be released
    }
    worker_.join();
    Job::Result stopped;
    stopped.error = "the server is shutting down";
    for (auto & job : queue_) job->finish(stopped);
    for (auto & slot : slots_) {
        if (slot->job) slot->job->finish(stopped);
    }
    for (EmbedRequest & q : embed_queue_) q.done.set_exception(std::make_exception_ptr(Error(stopped.error)));
}

int Scheduler::context_size() const { return target_.options.n_ctx; }

std::string Scheduler::suffix_scope(const Job & job) const { return options_.shared_suffix_cache ? "" : job.tenancy_.scope(); }

int Scheduler::capacity() const { return options_.parallel + options_.max_queued; }

bool Scheduler::failed() const {
    std::lock_guard lock(mutex_);
    return !failure_.empty();
}

void Scheduler::fail_all(const std::string & failure) {
    std::lock_guard lock(mutex_);
    failure_ = failure;
    Job::Result r;
    r.error = failure;
    // The slots' sequences stay as they are: the parked forward still holds them.
    for (auto & slot : slots_) {
        if (slot->job) slot->job->finish(r), ++metrics_.requests_failed;
    }
    for (auto & job : queue_) job->finish(r), ++metrics_.requests_failed;
    queue_.clear();
    for (EmbedRequest & q : embed_queue_) q.done.set_exception(std::make_exception_ptr(Error(failure)));
    embed_queue_.clear();
}

std::shared_ptr<Job> Scheduler::submit(std::vector<int32_t> prompt, const GenerationOptions & options, EarlyExitRequest early_exit,
                                       std::vector<std::string> stop, Tenancy tenancy, TextLimits limits, int id_slot) {
    std::vector<std::shared_ptr<Job>> jobs =
        submit_choices(std::move(prompt), options, 1, early_exit, std::move(stop), std::move(tenancy), limits, id_slot);
    return jobs.empty() ? nullptr : jobs.front();
}

std::vector<std::shared_ptr<Job>> Scheduler::submit_choices(std::vector<int32_t> prompt, const GenerationOptions & options, int n,
                                                            EarlyExitRequest early_exit, std::vector<std::string> stop, Tenancy tenancy,
                                                            TextLimits limits, int id_slot) {
    if (n < 1 || n > capacity()) {
        throw Error("n: " + std::to_string(n) + " choices, and the server's slots and queue hold " + std::to_string(capacity()));
    }
    if (id_slot < -1 || id_slot >= options_.parallel || (id_slot >= 0 && n > 1)) {
        throw Error("slot " + std::to_string(id_slot) + ": not one of the " + std::to_string(options_.parallel) + " slots (--parallel), or with more than one choice");
    }
    if (prompt.empty()) throw Error("empty prompt");
    if (early_exit.mode != EarlyExitMode::Off && !target_.exit_predictor) throw Error("SpecEE needs exit predictors (serve --specee FILE)");
    if (early_exit.mode == EarlyExitMode::Lossy && !options.sampling.greedy()) {
        throw Error("SpecEE's lossy mode decodes greedily: use temperature 0 (the lossless mode samples)");
    }
    if (early_exit.mode == EarlyExitMode::Lossy) check_lossy_early_exit_options(options);
    logits_processing(options, prompt, target_.tokenizer.get());  // bad options and grammars fail here, before a slot takes them
    if (!(early_exit.threshold >= 0.0f && early_exit.threshold <= 1.0f)) throw Error("the SpecEE threshold must be within 0..1");
    if (static_cast<int64_t>(prompt.size()) + std::max<int64_t>(options.n_predict, 0) > context_size()) {
        throw Error("prompt (" + std::to_string(prompt.size()) + " tokens) + max_tokens (" + std::to_string(options.n_predict) +
                    ") exceed the " + std::to_string(context_size()) + "-token context");
    }
    std::vector<std::shared_ptr<Job>> jobs;
    for (int i = 0; i < n; ++i) {
        GenerationOptions choice = options;
        choice.sampling.seed = options.sampling.seed + static_cast<uint64_t>(i);
        jobs.push_back(std::make_shared<Job>(prompt, choice, early_exit, stop));
        jobs[i]->tenancy_ = tenancy;
        jobs[i]->limits_ = limits;
        jobs[i]->slot_ = id_slot;
        if (i > 0) jobs[i]->leader_ = jobs[0];
    }
    jobs[0]->choices_ = n;
    {
        std::lock_guard lock(mutex_);
        if (!failure_.empty()) {
            Job::Result r;
            r.error = failure_;
            for (auto & job : jobs) job->finish(r), ++metrics_.requests_failed;
            return jobs;
        }
        int free_slots = 0;
        for (auto & slot : slots_) free_slots += !slot->job;
        if (static_cast<int>(queue_.size()) + n > options_.max_queued + free_slots) return {};
        queue_.insert(queue_.end(), jobs.begin(), jobs.end());
    }
    cv_.notify_all();
    return jobs;
}

void Scheduler::release(Slot & slot, bool finished_normally) {
    if (slot.running()) {
        const GenerationStats & st = slot.stats();
        metrics_.prompt_tokens += st.n_prompt;
        metrics_.prompt_tokens_cached += st.n_cached;
        metrics_.longest_sequence = std::max<uint64_t>(metrics_.longest_sequence, static_cast<uint64_t>(st.n_prompt + st.n_generated));
        metrics_.generated_tokens += st.n_generated;
        metrics_.prompt_seconds += st.prompt_seconds;
        metrics_.generation_seconds += st.generation_seconds;
        Job::Result r;
        r.stats = st;
        r.n_generated = st.n_generated;
        r.slot = slot.id;
        const int n_layer = target_.model->config().n_layer;
        if (slot.exit_sequence) r.stats.early_exit = slot.exit_sequence->exit_stats().summary(n_layer);
        if (slot.sequence && slot.job->early_exit_.mode == EarlyExitMode::Lossless) r.stats.early_exit = slot.exit_drafter->exit_stats().summary(n_layer);
        r.finish_reason = slot.ended_by_eog ? "stop" : "length";
        r.prompt_logprobs = std::move(slot.prompt_logprobs);
        if (finished_normally) {
            ++metrics_.requests_finished;
            if (suffix_cache_ && slot.sequence) suffix_cache_->add(slot.sequence->history(), suffix_scope(*slot.job));
        } else {
            ++metrics_.requests_cancelled;
            r.error = "cancelled";
        }
        slot.job->finish(r);
    }
    // The sequence's exact rows stay for the next request; a lossy sequence's are not exact.
    if (slot.sequence) keep_prefix(slot.prefix, *slot.cache, slot.sequence->history(), slot.sequence->n_exact(), slot.prefix.drafter);
    else forget_prefix(slot.prefix, *slot.cache);
    slot.sequence.reset();
    slot.exit_sequence.reset();
    slot.job.reset();
}

void Scheduler::fail_step(const std::vector<Slot *> & slots, const std::string & failure, bool client_error) {
    for (Slot * s : slots) {
        ++metrics_.requests_failed;
        Job::Result r;
        r.error = failure;
        r.client_error = client_error;
        s->job->finish(r);
        s->sequence.reset();
        s->exit_sequence.reset();
        s->job.reset();
        forget_prefix(s->prefix, *s->cache);
    }
}

void Scheduler::run() {
    std::unique_lock lock(mutex_);
    std::vector<Slot *> active;  // slots whose Sequence shares the step's target forward
    std::vector<Sequence *> sequences;
    std::vector<Slot *> lossy;  // slots decoding SpecEE's lossy mode: their own forwards, one token per step
    StepResult last_step;
    for (;;) {
        cv_.wait(lock, [&] {
            if (stopping_ || !queue_.empty() || !embed_queue_.empty()) return true;
            return std::any_of(slots_.begin(), slots_.end(), [](auto & s) { return s->job != nullptr; });
        });
        if (stopping_) return;
        if (!embed_queue_.empty()) {
            std::deque<EmbedRequest> requests = std::move(embed_queue_);
            embed_queue_.clear();
            lock.unlock();
            SchedulerMetrics counts;
            run_embeddings(requests, counts);
            lock.lock();
            metrics_.embedding_tokens += counts.embedding_tokens;
            metrics_.embedding_forwards += counts.embedding_forwards;
            metrics_.embedding_seconds += counts.embedding_seconds;
            if (!failure_.empty()) return;  // fail_all ended every request
        }
        const std::vector<Admitted> admitted = admit();
        if (!admitted.empty()) {
            // Setting a slot up moves rows over the network when the cache is on an rpc-server: a
            // server that stops answering must not keep the lock from fail_all and metrics().
            lock.unlock();
            std::vector<std::string> errors;
            for (const Admitted & a : admitted) errors.push_back(start(*a.slot, a.first));
            lock.lock();
            if (!failure_.empty()) return;  // fail_all ended every request
            for (size_t i = 0; i < admitted.size(); ++i) {
                if (!errors[i].empty()) fail_start(*admitted[i].slot, errors[i]);
            }
        }
        active.clear();
        sequences.clear();
        lossy.clear();
        for (auto & slot : slots_) {
            if (!slot->job) continue;
            if (slot->job->cancelled()) {
                release(*slot, false);  // a client that went away frees its slot at once
                continue;
            }
            if (slot->exit_sequence) {
                lossy.push_back(slot.get());
                continue;
            }
            if (slot->sequence->done()) {
                release(*slot, true);  // nothing to compute: n_predict 0 with the prompt's rows already cached
                continue;
            }
            active.push_back(slot.get());
            sequences.push_back(slot->sequence.get());
        }
        publish_slots();
        if (active.empty() && lossy.empty()) continue;

        lock.unlock();
        StepResult step;
        std::string failure;
        std::vector<std::pair<size_t, std::string>> grammar_failures;  // (index in active, message)
        const int decoding = static_cast<int>(std::count_if(sequences.begin(), sequences.end(), [](const Sequence * s) { return !s->prefilling(); }));
        const bool may_draft = !gate_ || decoding == 0 || gate_->allow(decoding);
        Tokenizer & tok = *target_.tokenizer;
        if (!sequences.empty()) {
            const auto t_step = std::chrono::steady_clock::now();
            try {
                step = step_sequences(
                    *target_.runner, sequences, [&](size_t i, int32_t t) { return active[i]->take(tok, t); }, last_step, may_draft, &grammar_failures);
                last_step = step;
                if (gate_ && decoding > 0) {
                    gate_->observe(decoding, step.tokens, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_step).count(),
                                   decoding == static_cast<int>(sequences.size()) && lossy.empty());
                }
            } catch (const std::exception & e) {
                failure = e.what();
            }
        }
        std::vector<std::pair<std::string, bool>> lossy_failure(lossy.size());  // (message, the request's grammar)
        int lossy_tokens = 0;
        for (size_t i = 0; i < lossy.size(); ++i) {
            Slot & s = *lossy[i];
            try {
                const ExitStep * e = s.exit_sequence->step([&](int32_t t) { return s.take(tok, t); });
                if (!e) continue;
                ++lossy_tokens;
                s.job->publish([e](size_t) { return std::pair<const char *, int>{e->exit_layer >= 0 ? "exit" : "bonus", std::max(e->exit_layer, 0)}; },
                               s.exit_sequence->stats());
            } catch (const GrammarError & e) {
                lossy_failure[i] = {e.what(), true};
            } catch (const std::exception & e) {
                lossy_failure[i] = {e.what(), false};
            }
        }
        lock.lock();
        if (!failure_.empty()) return;  // fail_all ended every request; a late step's results go nowhere

        for (size_t i = 0; i < lossy.size(); ++i) {
            if (!lossy_failure[i].first.empty()) fail_step({lossy[i]}, lossy_failure[i].first, lossy_failure[i].second);
        }
        if (!grammar_failures.empty()) {  // those requests end, the others' step goes on
            std::vector<char> gone(active.size(), 0);
            for (const auto & [i, message] : grammar_failures) fail_step({active[i]}, message, true), gone[i] = 1;
            std::vector<Slot *> rest;
            for (size_t i = 0; i < active.size(); ++i) {
                if (!gone[i]) rest.push_back(active[i]);
            }
            active = std::move(rest);
        }
        const int busy = static_cast<int>(sequences.size() + lossy.size());
        if (!failure.empty()) {
            fail_step(active, failure);
            active.clear();
        }
        account_step(active, lossy, busy, step, lossy_tokens, !sequences.empty() && !may_draft);
        publish_slots();
    }
}

}  // namespace specula
