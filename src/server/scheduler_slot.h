#pragma once
// A scheduler slot's state, shared by the files that implement Scheduler (scheduler.cpp: the worker
// loop and requests' lifecycle; scheduler_admission.cpp: queued jobs into slots; scheduler_metrics.cpp:
// the counters). Not part of scheduler.h, whose users see only the Scheduler.
#include <memory>
#include <optional>

#include "engine/generate.h"
#include "engine/sequence.h"
#include "engine/specee.h"
#include "policy/catch_up_gate.h"
#include "runtime/kv_cache.h"
#include "server/scheduler.h"
#include "server/slot_prefix.h"
#include "tokenizer/tokenizer.h"

namespace specula {

struct Scheduler::Slot {
    int id = 0;
    std::unique_ptr<KvCache> cache;
    SlotPrefix prefix;  // what the cache (and a drafter's state) hold for the next request (server/slot_prefix.h)
    std::unique_ptr<Drafter> drafter;
    std::unique_ptr<DraftLengthPolicy> policy;
    std::unique_ptr<TreeSizePolicy> tree_size;
    std::unique_ptr<CatchUpGate> catch_up;
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
    std::optional<TokenLogprob> logprob;        // the next emitted token's (on_logprob comes before its sink)
    std::vector<TokenLogprob> prompt_logprobs;  // the job's prompt tokens' after the first (on_prompt_logprob), for its result
    // A token the sequence emitted, into the job (the sequence's sink); false stops the sequence.
    bool take(const Tokenizer & tok, int32_t t) {
        const bool end = job->options_.stop_at_end_of_generation && ends_generation(job->options_, tok, t);
        ended_by_eog = ended_by_eog || end;
        std::optional<TokenLogprob> taken = std::move(logprob);
        logprob.reset();
        return job->take(t, end ? std::string() : tok.piece(t, job->options_.special_token_text), std::move(taken)) && !job->cancelled();
    }
    SpeculationStats seen;             // the sequence's counters already added to the metrics
    SchedulerMetrics::Slot published;  // what metrics() reports (publish_slots)
};

}  // namespace specula
