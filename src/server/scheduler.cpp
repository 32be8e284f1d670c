#include "server/scheduler.h"

#include <algorithm>
#include <exception>
#include <future>

#include "specula/error.h"
#include "engine/sequence.h"
#include "engine/model_bundle.h"
#include "engine/specee.h"
#include "runtime/backend.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "server/prefix_store.h"
#include "server/slot_prefix.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace specula {

struct Scheduler::Slot {
    int id = 0;
    std::unique_ptr<KvCache> cache;
    SlotPrefix prefix;  // what the cache (and a drafter's state) hold for the next request (server/slot_prefix.h)
    std::unique_ptr<Drafter> drafter;
    std::unique_ptr<DraftLengthPolicy> policy;
    std::unique_ptr<TreeSizePolicy> tree_size;
    std::shared_ptr<Job> job;
    // SpecEE, made on the slot's first request that asks for it and kept: the lossy mode's
    // decoder and sequence (candidates from the slot's EAGLE-3 drafter), the lossless drafter
    // (its own target cache and head) and its draft policy. Declared before the sequences that
    // refer to them, so that they are destroyed after them.
    std::unique_ptr<EarlyExitDecoder> exit_decoder;
    std::unique_ptr<EarlyExitDrafter> exit_drafter;
    std::unique_ptr<DraftLengthPolicy> exit_policy;
    std::unique_ptr<Sequence> sequence;
    std::unique_ptr<EarlyExitSequence> exit_sequence;
    const GenerationStats & stats() const { return exit_sequence ? exit_sequence->stats() : sequence->stats(); }
    bool running() const { return sequence || exit_sequence; }
    bool ended_by_eog = false;
    std::optional<TokenLogprob> logprob;  // the next emitted token's (on_logprob comes before its sink)
    // A token the sequence emitted, into the job (the sequence's sink); false stops the sequence.
    bool take(const Tokenizer & tok, int32_t t) {
        const bool end = job->options_.stop_at_end_of_generation && tok.is_end_of_generation(t);
        ended_by_eog = ended_by_eog || end;
        std::optional<TokenLogprob> taken = std::move(logprob);
        logprob.reset();
        return job->take(end ? std::string() : tok.piece(t), std::move(taken)) && !job->cancelled();
    }
    SpeculationStats seen;             // the sequence's counters already added to the metrics
    SchedulerMetrics::Slot published;  // what metrics() reports (publish_slots)
};

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
    if (options.suffix_cache_tokens > 0) {
        const DrafterSpec & spec = target.drafter.spec;
        auto cache = std::make_shared<SuffixCache>(options.suffix_cache_tokens, spec.ngram_min, spec.ngram_max);
        bool looked_up = false;
        for (auto & slot : slots_) looked_up = (slot->drafter && slot->drafter->use_suffix_cache(cache)) || looked_up;
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
}

int Scheduler::context_size() const { return target_.options.n_ctx; }

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
}

std::shared_ptr<Job> Scheduler::submit(std::vector<int32_t> prompt, const GenerationOptions & options, EarlyExitRequest early_exit,
                                       std::vector<std::string> stop) {
    std::vector<std::shared_ptr<Job>> jobs = submit_choices(std::move(prompt), options, 1, early_exit, std::move(stop));
    return jobs.empty() ? nullptr : jobs.front();
}

std::vector<std::shared_ptr<Job>> Scheduler::submit_choices(std::vector<int32_t> prompt, const GenerationOptions & options, int n,
                                                            EarlyExitRequest early_exit, std::vector<std::string> stop) {
    if (n < 1 || n > options_.parallel) {
        throw Error("n: " + std::to_string(n) + " choices need as many slots, and the server has " + std::to_string(options_.parallel));
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

SchedulerMetrics Scheduler::metrics() const {
    std::lock_guard lock(mutex_);
    SchedulerMetrics m = metrics_;
    if (suffix_cache_) m.suffix_cache = suffix_cache_->stats();
    if (store_) m.prefix_store = store_->stats();
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
        p.n_cached = slot->cache->size();
        p.n_prompt = slot->running() ? slot->stats().n_prompt : 0;
        p.n_generated = slot->running() ? slot->stats().n_generated : 0;
    }
}

void Scheduler::admit() {
    std::vector<const SlotPrefix *> prefixes;
    std::vector<char> free;
    for (auto & slot : slots_) prefixes.push_back(&slot->prefix);
    for (;;) {
        while (!queue_.empty() && queue_.front()->cancelled()) {
            ++metrics_.requests_cancelled;
            Job::Result r;
            r.error = "cancelled";
            queue_.front()->finish(r);
            queue_.pop_front();
        }
        if (queue_.empty()) return;
        free.clear();
        for (auto & slot : slots_) free.push_back(!slot->job);
        Slot * first = nullptr;
        if (!may_start(*queue_.front(), static_cast<int>(std::count(free.begin(), free.end(), 1)), first)) return;
        const int chosen = choose_slot(prefixes, free, queue_.front()->prompt_);
        if (chosen < 0) return;
        std::unique_ptr<Slot> & slot = slots_[chosen];
        std::shared_ptr<Job> job = queue_.front();
        queue_.pop_front();
        slot->prefix.last_used = ++admitted_;
        // The slot's rows are lost to a lossy sequence and a further choice whatever their prompt.
        const bool keeps_rows = !first && job->early_exit_.mode != EarlyExitMode::Lossy;
        if (store_) stash_prefix(*store_, slot->prefix, *slot->cache, keeps_rows ? std::span<const int32_t>(job->prompt_) : std::span<const int32_t>());
        if (first) {
            const bool own_drafter = job->early_exit_.mode == EarlyExitMode::Off;  // SpecEE's drafter rebuilds itself
            share_prompt(slot->prefix, *slot->cache, own_drafter ? slot->drafter.get() : nullptr, *first->cache,
                         own_drafter ? first->drafter.get() : nullptr, job->prompt_);
        }
        try {
            // The slot's policies carry what they measured of the machine from request to request
            // (DraftLengthPolicy::begin_sequence): with fresh ones every request drafted blind
            // in its first round, a tree at 8 clients, where no draft pays on a CPU.
            if (target_.speculative && !slot->policy) {
                slot->policy = target_.make_draft_policy();
                slot->tree_size = target_.make_tree_size_policy();
            }
            if (slot->policy) slot->policy->begin_sequence();
            if (slot->tree_size) slot->tree_size->begin_sequence();
            Tokenizer & tok = *target_.tokenizer;
            Slot * s = slot.get();
            auto is_end = [&tok](int32_t t) { return tok.is_end_of_generation(t); };
            // A round's tokens reach the job's consumer once its verification says where each came from.
            auto on_round = [s](const RoundInfo & r) {
                const size_t n_accepted = r.result->accepted.size();
                const bool bonus = r.result->bonus;
                s->job->publish([&](size_t i) {
                    return std::pair<const char *, int>{i < n_accepted ? "accepted" : bonus ? "bonus"
                                                                                            : "correction",
                                                        static_cast<int>(i) + 1};
                });
            };
            GenerationOptions options = job->options_;
            if (options.top_logprobs >= 0) options.on_logprob = [s](const TokenLogprob & l) { s->logprob = l; };
            const EarlyExitRequest & exit = job->early_exit_;
            if (exit.mode == EarlyExitMode::Lossy) {
                forget_prefix(slot->prefix, *slot->cache);  // the lossy sequence starts cold; its rows are never reused
                if (!slot->exit_decoder) slot->exit_decoder = std::make_unique<EarlyExitDecoder>(*target_.model, *target_.runner, target_.exit_predictor.get(),
                                                                                                 target_.options.specee_online);
                slot->exit_sequence = std::make_unique<EarlyExitSequence>(*slot->exit_decoder, *target_.runner, *slot->cache, *slot->drafter,
                                                                          job->prompt_, options, exit.threshold, is_end, options_.prefill_chunk);
            } else if (exit.mode == EarlyExitMode::Lossless) {
                // Chains (engine/generation_mode.h): the tokens up to the first that did not exit.
                if (!slot->exit_drafter) {
                    slot->exit_drafter = target_.make_exit_drafter(target_.options.n_ctx, exit.threshold);
                    slot->exit_policy = target_.make_draft_policy();
                }
                slot->exit_drafter->set_threshold(exit.threshold);
                slot->exit_drafter->clear_exit_stats();
                slot->exit_policy->begin_sequence();
                if (store_ && !first) restore_prefix(*store_, slot->prefix, *slot->cache, slot->exit_drafter.get(), job->prompt_);
                reuse_prefix(slot->prefix, *slot->cache, slot->exit_drafter.get(), job->prompt_);
                slot->sequence = std::make_unique<Sequence>(target_.sequence_parts(GenerationMode::SpeceeLossless, *slot->cache, slot->exit_drafter.get(),
                                                                                   slot->exit_policy.get(), nullptr, on_round),
                                                            job->prompt_, options, is_end, options_.prefill_chunk);
            } else {
                // Without a drafter (a bundle that does not speculate) every round verifies the root alone.
                if (store_ && !first) restore_prefix(*store_, slot->prefix, *slot->cache, slot->drafter.get(), job->prompt_);
                reuse_prefix(slot->prefix, *slot->cache, slot->drafter.get(), job->prompt_);
                slot->sequence = std::make_unique<Sequence>(target_.sequence_parts(GenerationMode::Speculative, *slot->cache, slot->drafter.get(),
                                                                                   slot->policy.get(), slot->tree_size.get(), on_round),
                                                            job->prompt_, options, is_end, options_.prefill_chunk);
            }
            s->logprob.reset();
            s->ended_by_eog = false;
            s->seen = {};
            slot->job = std::move(job);
        } catch (const std::exception & e) {
            ++metrics_.requests_failed;
            Job::Result r;
            r.error = e.what();
            job->finish(r);
            slot->sequence.reset();
            slot->exit_sequence.reset();
            forget_prefix(slot->prefix, *slot->cache);
        }
    }
}

bool Scheduler::may_start(const Job & job, int free_slots, Slot *& first) const {
    first = nullptr;
    if (job.choices_ > free_slots) return false;
    if (!job.leader_) return true;
    for (const auto & slot : slots_) {
        if (slot->job != job.leader_ || !slot->sequence) continue;  // a lossy first choice shares nothing
        if (slot->sequence->prefilling()) return false;
        if (slot->sequence->stats().speculation.rounds == 0) first = slot.get();  // the cache holds the prompt, and only it
    }
    return true;
}

void Scheduler::release(Slot & slot, bool finished_normally) {
    if (slot.running()) {
        const GenerationStats & st = slot.stats();
        metrics_.prompt_tokens += st.n_prompt;
        metrics_.prompt_tokens_cached += st.n_cached;
        metrics_.generated_tokens += st.n_generated;
        metrics_.prompt_seconds += st.prompt_seconds;
        metrics_.generation_seconds += st.generation_seconds;
        Job::Result r;
        r.stats = st;
        r.n_generated = st.n_generated;
        const int n_layer = target_.model->config().n_layer;
        if (slot.exit_sequence) r.stats.early_exit = slot.exit_sequence->exit_stats().summary(n_layer);
        if (slot.sequence && slot.job->early_exit_.mode == EarlyExitMode::Lossless) r.stats.early_exit = slot.exit_drafter->exit_stats().summary(n_layer);
        r.finish_reason = slot.ended_by_eog ? "stop" : "length";
        if (finished_normally) {
            ++metrics_.requests_finished;
            if (suffix_cache_ && slot.sequence) suffix_cache_->add(slot.sequence->history());
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

void Scheduler::fail_step(const std::vector<Slot *> & slots, const std::string & failure) {
    for (Slot * s : slots) {
        ++metrics_.requests_failed;
        Job::Result r;
        r.error = failure;
        s->job->finish(r);
        s->sequence.reset();
        s->exit_sequence.reset();
        s->job.reset();
        forget_prefix(s->prefix, *s->cache);
    }
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
        if (s->exit_sequence && s->exit_sequence->done()) release(*s, !s->job->cancelled());
    }
    for (Slot * s : active) {
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

void Scheduler::run() {
    std::unique_lock lock(mutex_);
    std::vector<Slot *> active;  // slots whose Sequence shares the step's target forward
    std::vector<Sequence *> sequences;
    std::vector<Slot *> lossy;  // slots decoding SpecEE's lossy mode: their own forwards, one token per step
    StepResult last_step;
    for (;;) {
        cv_.wait(lock, [&] {
            if (stopping_ || !queue_.empty()) return true;
            return std::any_of(slots_.begin(), slots_.end(), [](auto & s) { return s->job != nullptr; });
        });
        if (stopping_) return;
        admit();
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
            active.push_back(slot.get());
            sequences.push_back(slot->sequence.get());
        }
        publish_slots();
        if (active.empty() && lossy.empty()) continue;

        lock.unlock();
        StepResult step;
        std::string failure;
        const int decoding = static_cast<int>(std::count_if(sequences.begin(), sequences.end(), [](const Sequence * s) { return !s->prefilling(); }));
        const bool may_draft = !gate_ || decoding == 0 || gate_->allow(decoding);
        Tokenizer & tok = *target_.tokenizer;
        if (!sequences.empty()) {
            const auto t_step = std::chrono::steady_clock::now();
            try {
                step = step_sequences(
                    *target_.runner, sequences, [&](size_t i, int32_t t) { return active[i]->take(tok, t); }, last_step, may_draft);
                last_step = step;
                if (gate_ && decoding > 0) {
                    gate_->observe(decoding, step.tokens, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_step).count(),
                                   decoding == static_cast<int>(sequences.size()) && lossy.empty());
                }
            } catch (const std::exception & e) {
                failure = e.what();
            }
        }
        std::vector<std::string> lossy_failure(lossy.size());
        int lossy_tokens = 0;
        for (size_t i = 0; i < lossy.size(); ++i) {
            Slot & s = *lossy[i];
            try {
                const ExitStep * e = s.exit_sequence->step([&](int32_t t) { return s.take(tok, t); });
                if (!e) continue;
                ++lossy_tokens;
                s.job->publish([e](size_t) { return std::pair<const char *, int>{e->exit_layer >= 0 ? "exit" : "bonus", std::max(e->exit_layer, 0)}; });
            } catch (const std::exception & e) {
                lossy_failure[i] = e.what();
            }
        }
        lock.lock();
        if (!failure_.empty()) return;  // fail_all ended every request; a late step's results go nowhere

        for (size_t i = 0; i < lossy.size(); ++i) {
            if (!lossy_failure[i].empty()) fail_step({lossy[i]}, lossy_failure[i]);
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
