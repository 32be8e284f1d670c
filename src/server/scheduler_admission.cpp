// Scheduler's admission: queued jobs into free slots, each reusing what its slot, the prefix
// store or its first choice's slot already holds of its prompt.
#include "server/scheduler_slot.h"

#include <algorithm>
#include <exception>

#include "engine/model_bundle.h"
#include "server/prefix_store.h"

namespace specula {

void Scheduler::drop_cancelled_queued() {
    while (!queue_.empty() && queue_.front()->cancelled()) {
        ++metrics_.requests_cancelled;
        Job::Result r;
        r.error = "cancelled";
        queue_.front()->finish(r);
        queue_.pop_front();
    }
}

int Scheduler::slot_for_front(std::span<const SlotPrefix * const> prefixes, Slot *& first) const {
    const Job & job = *queue_.front();
    std::vector<char> free;
    for (auto & slot : slots_) free.push_back(!slot->job);
    if (!may_start(job, static_cast<int>(std::count(free.begin(), free.end(), 1)), first)) return -1;
    if (job.slot_ >= 0) {
        for (size_t i = 0; i < free.size(); ++i) free[i] = free[i] && static_cast<int>(i) == job.slot_;
    }
    return choose_slot(prefixes, free, job.prompt_, job.tenancy_.scope());
}

std::vector<Scheduler::Admitted> Scheduler::admit() {
    std::vector<Admitted> admitted;
    std::vector<const SlotPrefix *> prefixes;
    for (auto & slot : slots_) prefixes.push_back(&slot->prefix);
    for (;;) {
        drop_cancelled_queued();
        if (queue_.empty()) return admitted;
        Slot * first = nullptr;
        const int chosen = slot_for_front(prefixes, first);
        if (chosen < 0) return admitted;
        Slot & slot = *slots_[chosen];
        slot.job = queue_.front();
        queue_.pop_front();
        slot.job->admitted_at_ = std::chrono::steady_clock::now();
        slot.prefix.last_used = ++admitted_;
        admitted.push_back({&slot, first});
    }
}

std::string Scheduler::start(Slot & slot, Slot * first) {
    const std::shared_ptr<Job> job = slot.job;
    // The slot's rows are lost to a lossy sequence, a further choice and another scope's request
    // whatever their prompt.
    const std::string scope = job->tenancy_.scope();
    const bool keeps_rows = !first && job->early_exit_.mode != EarlyExitMode::Lossy && slot.prefix.scope == scope;
    try {
        if (store_) stash_prefix(*store_, slot.prefix, *slot.cache, keeps_rows ? std::span<const int32_t>(job->prompt_) : std::span<const int32_t>());
        if (slot.prefix.scope != scope) forget_prefix(slot.prefix, *slot.cache);
        slot.prefix.scope = scope;
        if (suffix_cache_) slot.drafter->use_suffix_cache(suffix_cache_, suffix_scope(*job));
        if (first) {
            const bool own_drafter = job->early_exit_.mode == EarlyExitMode::Off;  // SpecEE's drafter rebuilds itself
            share_prompt(slot.prefix, *slot.cache, own_drafter ? slot.drafter.get() : nullptr, *first->cache,
                         own_drafter ? first->drafter.get() : nullptr, job->prompt_);
        }
        // The slot's policies carry what they measured of the machine from request to request
        // (DraftLengthPolicy::begin_sequence): with fresh ones every request drafted blind
        // in its first round, a tree at 8 clients, where no draft pays on a CPU.
        if (target_.speculative && !slot.policy) {
            slot.policy = target_.make_draft_policy();
            slot.tree_size = target_.make_tree_size_policy();
            slot.catch_up = target_.make_catch_up_gate();
        }
        if (slot.policy) slot.policy->begin_sequence();
        if (slot.tree_size) slot.tree_size->begin_sequence();
        Tokenizer & tok = *target_.tokenizer;
        Slot * s = &slot;
        auto is_end = [&tok, job](int32_t t) { return ends_generation(job->options_, tok, t); };
        // A round's tokens reach the job's consumer once its verification says where each came from.
        auto on_round = [s](const RoundInfo & r) {
            const size_t n_accepted = r.result->accepted.size();
            const bool bonus = r.result->bonus;
            s->job->publish(
                [&](size_t i) {
                    return std::pair<const char *, int>{i < n_accepted ? "accepted" : bonus ? "bonus"
                                                                                            : "correction",
                                                        static_cast<int>(i) + 1};
                },
                s->stats());
        };
        GenerationOptions options = job->options_;
        if (options.top_logprobs >= 0) options.on_logprob = [s](const TokenLogprob & l) { s->logprob = l; };
        // A request's choices share one prompt: its first computes the prompt's logprobs, the others reuse its rows.
        if (options.prompt_logprobs >= 0 && !job->leader_) options.on_prompt_logprob = [s](const TokenLogprob & l) { s->prompt_logprobs.push_back(l); };
        else options.prompt_logprobs = -1;
        const EarlyExitRequest & exit = job->early_exit_;
        if (exit.mode == EarlyExitMode::Lossy) {
            forget_prefix(slot.prefix, *slot.cache);  // the lossy sequence starts cold; its rows are never reused
            if (!slot.exit_decoder) slot.exit_decoder = std::make_unique<EarlyExitDecoder>(*target_.model, *target_.runner, target_.exit_predictor.get(),
                                                                                           target_.options.specee_online);
            slot.exit_sequence = std::make_unique<EarlyExitSequence>(*slot.exit_decoder, *target_.runner, *slot.cache, *slot.drafter,
                                                                     job->prompt_, options, exit.threshold, is_end, options_.prefill_chunk);
        } else if (exit.mode == EarlyExitMode::Lossless) {
            // Chains (engine/generation_mode.h): the tokens up to the first that did not exit.
            if (!slot.exit_drafter) {
                slot.exit_drafter = target_.make_exit_drafter(target_.options.n_ctx, exit.threshold);
                slot.exit_policy = target_.make_draft_policy();
            }
            slot.exit_drafter->set_threshold(exit.threshold);
            slot.exit_drafter->clear_exit_stats();
            slot.exit_policy->begin_sequence();
            if (store_ && !first) restore_prefix(*store_, slot.prefix, *slot.cache, slot.exit_drafter.get(), job->prompt_);
            reuse_prefix(slot.prefix, *slot.cache, slot.exit_drafter.get(), job->prompt_);
            slot.sequence = std::make_unique<Sequence>(target_.sequence_parts(GenerationMode::SpeceeLossless, *slot.cache, slot.exit_drafter.get(),
                                                                              slot.exit_policy.get(), nullptr, on_round),
                                                       job->prompt_, options, is_end, options_.prefill_chunk);
        } else {
            // Without a drafter (a bundle that does not speculate) every round verifies the root alone.
            if (store_ && !first) restore_prefix(*store_, slot.prefix, *slot.cache, slot.drafter.get(), job->prompt_);
            reuse_prefix(slot.prefix, *slot.cache, slot.drafter.get(), job->prompt_);
            SequenceParts parts = target_.sequence_parts(GenerationMode::Speculative, *slot.cache, slot.drafter.get(), slot.policy.get(),
                                                         slot.tree_size.get(), on_round);
            parts.catch_up = slot.catch_up.get();
            slot.sequence = std::make_unique<Sequence>(parts, job->prompt_, options, is_end, options_.prefill_chunk);
        }
        slot.logprob.reset();
        slot.prompt_logprobs.clear();
        slot.ended_by_eog = false;
        slot.seen = {};
        report_prompt_progress(slot);
        return "";
    } catch (const std::exception & e) {
        slot.sequence.reset();
        slot.exit_sequence.reset();
        forget_prefix(slot.prefix, *slot.cache);
        return e.what();
    }
}

void Scheduler::fail_start(Slot & slot, const std::string & error) {
    ++metrics_.requests_failed;
    Job::Result r;
    r.error = error;
    slot.job->finish(r);
    slot.job.reset();
}

bool Scheduler::may_start(const Job & job, int free_slots, Slot *& first) const {
    first = nullptr;
    if (std::min(job.choices_, options_.parallel) > free_slots) return false;
    if (!job.leader_) return true;
    for (const auto & slot : slots_) {
        if (slot->job != job.leader_) continue;
        if (!slot->running()) return false;  // admitted with this one, not yet started
        if (!slot->sequence) continue;       // a lossy first choice shares nothing
        if (slot->sequence->prefilling()) return false;
        if (slot->sequence->stats().speculation.rounds == 0) first = slot.get();  // the cache holds the prompt, and only it
    }
    return true;
}

}  // namespace specula
