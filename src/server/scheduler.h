#pragma once
// Continuous batching for `specula serve`: N slots, each a cache stream of one KV pool with its own
// drafter, policies and Rng; requests beyond N wait in a bounded queue. One worker thread steps
// every active sequence together, one target forward per step (prefill chunks and drafts side by
// side, engine/sequence.h), so a sequence's output never depends on which others share the step.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "draft/suffix_cache.h"
#include "policy/speculation_gate.h"
#include "server/embeddings.h"
#include "server/prefix_store.h"
#include "specula/specula.h"
#include "tokenizer/stop_strings.h"
#include "tokenizer/utf8.h"

namespace specula {

class KvCache;
struct ModelBundle;
struct StepResult;

struct SchedulerOptions {
    int parallel = 1;         // slots: sequences generating at once
    int max_queued = 64;      // requests waiting for a slot; more are refused
    int prefill_chunk = 256;  // prompt tokens a prefilling sequence adds per step
    // Measure, per load, steps that may draft against steps that may not and keep the faster
    // (policy/speculation_gate.h). Only where the drafts are sized by measured times (cost policy,
    // per-round tree size): fixed draft sizes stay what the user chose, and with them a seeded
    // sampled output whatever the neighbours.
    bool gate_speculation = true;
    // Tokens of earlier requests (prompt and output) kept for lookup drafting (draft/suffix_cache.h); 0: none.
    size_t suffix_cache_tokens = SuffixCache::kDefaultMaxTokens;
    // Host bytes of slots' rows kept for later requests once other conversations take the slots
    // (server/prefix_store.h); 0: none.
    size_t cache_bytes = PrefixStore::kDefaultMaxBytes;
    // Whether lookup drafts read every tenant's earlier requests (serve --shared-suffix-cache)
    // rather than only those of the request's own tenant and cache salt (Tenancy).
    bool shared_suffix_cache = false;
    // Embeddings (serve --embeddings): embed() computes them in a KV stream of their own, pooled
    // this way; false: embed() refuses.
    bool embeddings = false;
    embeddings::Pooling pooling = embeddings::Pooling::Mean;
};

// Whose request a job is. The caches (a slot's rows, the prefix store, the suffix cache unless
// shared) serve a request only what requests of the same tenant and cache salt left, and /slots
// shows a tenant the figures of its own requests' slots only (docs/server.md, "Tenants").
struct Tenancy {
    std::string tenant = "anonymous";  // server/access.h, tenant_of: never a key itself
    std::string cache_salt;            // the request's "cache_salt"; "" without one
    // The caches' key: both in one string (a tenant's name holds no '\n').
    std::string scope() const { return tenant + '\n' + cache_salt; }
};

// Where an emitted token came from, for the live page's colours (the stream's "specula" field).
struct TokenOrigin {
    std::string text;   // whole UTF-8 characters: a token ending inside a character gives its bytes to the next one
    const char * kind;  // "accepted" (a draft the target accepted) | "bonus" | "correction" (the target's own token)
    int depth = 0;      // 1-based position after the round's root
};

// SpecEE per request (docs/specee.md): off, the lossy early exit (greedy; may differ from plain
// decoding) or the lossless mode (exited tokens as drafts the target verifies), at a threshold.
enum class EarlyExitMode {
    Off,
    Lossy,
    Lossless
};
struct EarlyExitRequest {
    EarlyExitMode mode = EarlyExitMode::Off;
    float threshold = 1.0f;
};

// llama-server's limits on an /infill request's text (server/infill.h), checked at every token the
// sequence emits, accepted drafts included: the sequence stops at the token that ends the text.
struct TextLimits {
    // > 0: a line after the text's first newline whose first non-blank character comes after fewer
    // blanks (spaces, tabs) ends the text before that character.
    int n_indent = 0;
    // > 0: past this long after the first token, the text ends at the next token holding a newline.
    std::chrono::milliseconds max_predict{0};
    // > 0: when the prompt took longer than this from the slot's admission, the text ends at its first token.
    std::chrono::milliseconds max_prompt{0};
    bool any() const { return n_indent > 0 || max_predict.count() > 0 || max_prompt.count() > 0; }
};

// One request's life, shared by the HTTP handler (consumer) and the scheduler (producer).
class Job {
public:
    // `stop`: stop strings (tokenizer/stop_strings.h); the text ends where the first one starts.
    Job(std::vector<int32_t> prompt, GenerationOptions options, EarlyExitRequest early_exit = {}, std::vector<std::string> stop = {})
        : prompt_(std::move(prompt)), options_(std::move(options)), early_exit_(early_exit), stops_(std::move(stop)) {}

    struct Result {
        std::string finish_reason;  // "stop" (end of generation or a stop string) | "length"
        // llama-server's stop_type: "eos" (end of generation), "word" (stopping_word, a stop
        // string), "limit" (n_predict, the context or a TextLimits rule)
        std::string stop_type;
        std::string stopping_word;
        std::string error;          // non-empty: the job failed
        bool client_error = false;  // ...by the request's own grammar (GrammarError): answered 400
        int slot = -1;              // the slot that ran it
        GenerationStats stats;
        int n_generated = 0;
        // With GenerationOptions::prompt_logprobs, the first choice's: the prompt's tokens after the first.
        std::vector<TokenLogprob> prompt_logprobs;
    };
    // llama-server's prompt_progress: the prompt's tokens (total), those the slot's cache held at
    // the start (cache), those in the cache so far, the cached ones included (processed: total once
    // the prompt is all in, the last token, which the first round computes, counted with the last
    // chunk), and the milliseconds since the slot took the job (0 at the first report).
    struct PromptProgress {
        int total = 0, cache = 0, processed = 0;
        double time_ms = 0;
    };
    // Waits up to `timeout` for new text or the end. Text: the new text (whole UTF-8 characters
    // only; none when only logprobs or progress came) was appended to `text`. Ended: the job has ended and all
    // its text was taken; result() is final. Idle: nothing happened (a chance to see whether the
    // client is still there).
    enum class Wait {
        Text,
        Ended,
        Idle
    };
    // `origins` (may be null) gets the new text's tokens; their texts concatenate to the new text.
    // `logprobs` (may be null) gets the logprobs of the tokens whose text has all been released
    // (options.on_logprob is the scheduler's); a token cut by a stop string never is. `ids` (may be
    // null) gets those tokens' ids (an end-of-generation token's too), in order. `progress` (may be
    // null) gets the prompt's progress reports since the last call, one per change: at the start,
    // after each prefill step, the last with processed == total, all before the first token's text.
    Wait next(std::string & text, std::vector<TokenOrigin> * origins = nullptr, std::vector<TokenLogprob> * logprobs = nullptr,
              std::chrono::milliseconds timeout = std::chrono::milliseconds(200), std::vector<int32_t> * ids = nullptr,
              std::vector<PromptProgress> * progress = nullptr);
    const Result & result() const { return result_; }
    // The generation's figures so far (prompt and cached tokens, prompt time, tokens generated and
    // the time since the first), as of the last round published; all zero before the first.
    GenerationStats progress() const;
    const std::vector<int32_t> & prompt() const { return prompt_; }
    // The client went away: the scheduler frees the slot at its next step.
    void cancel() { cancelled_ = true; }
    bool cancelled() const { return cancelled_; }

private:
    friend class Scheduler;
    // Scheduler side, on its worker. take(): a token the sequence emitted, its text (empty for an
    // end-of-generation token) through the stop strings; false once a stop string has ended in it.
    // publish(): where the tokens taken since the last publish came from (origin_of(i): the i-th's
    // kind and depth), which makes their released text and logprobs the consumer's.
    bool take(int32_t id, const std::string & piece, std::optional<TokenLogprob> logprob);
    // The TextLimits' verdict on a token's text, which it may cut short; false: the text ends here.
    bool within_limits(std::string & text);
    // `stats`: the sequence's figures after the round (progress()).
    void publish(const std::function<std::pair<const char *, int>(size_t)> & origin_of, const GenerationStats & stats);
    void finish(Result result);
    void release(const std::string & text);  // under mutex_: the next bytes of the held tokens' text
    // The prompt's progress (PromptProgress), from the worker: the first call reports the start
    // (processed == cache) too; a report that adds nothing, or any after the prompt is all in, is dropped.
    void report_prompt(int total, int cache, int processed);

    const std::vector<int32_t> prompt_;
    const GenerationOptions options_;
    const EarlyExitRequest early_exit_;
    Tenancy tenancy_;              // set by the scheduler's submit_choices before the job is queued
    TextLimits limits_;            // likewise
    int slot_ = -1;                // likewise: the slot the request asked for (id_slot), or -1 for any
    int choices_ = 1;              // the first choice of a request: how many it has (Scheduler::submit_choices)
    std::shared_ptr<Job> leader_;  // a further choice: the first, whose prefilled prompt it takes
    std::atomic<bool> cancelled_{false};
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    GenerationStats progress_;  // under mutex_
    std::string pending_;       // complete characters not yet taken
    std::vector<TokenOrigin> pending_origins_;
    std::vector<TokenLogprob> pending_logprobs_;
    std::vector<int32_t> pending_ids_;
    std::vector<PromptProgress> pending_progress_;  // a few per prompt: its steps' reports, until taken
    bool prompt_started_ = false, prompt_in_ = false;
    int processed_ = 0;  // of the prompt, at the last report
    StopStrings stops_;  // worker side, as round_ and held_
    struct Taken {
        int32_t id = -1;
        size_t bytes = 0;      // of the token's text
        std::string released;  // the text the stop strings released at this token
        std::optional<TokenLogprob> logprob;
    };
    std::vector<Taken> round_;  // taken, not yet published
    struct Held {
        int32_t id = -1;
        size_t bytes = 0;  // of the token's text, not yet released
        std::optional<TokenLogprob> logprob;
        const char * kind;
        int depth;
    };
    std::deque<Held> held_;                       // published tokens, in order, from the first whose text is not all released
    Utf8Stream utf8_;                             // holds the start of a UTF-8 character split across tokens
    TokenOrigin partial_origin_{"", "bonus", 0};  // the token whose bytes utf8_ holds back
    bool finished_ = false;
    Result result_;
    // Worker side, for limits_: when the slot took the job and emitted its first token, the lines
    // begun and whether the current one's indentation is known yet.
    std::chrono::steady_clock::time_point admitted_at_, first_token_at_;
    int tokens_taken_ = 0, newlines_ = 0, line_blanks_ = 0;
    bool line_indent_known_ = false, limited_ = false;
};

// Counters for /metrics and /slots (a consistent copy).
struct SchedulerMetrics {
    int slots = 0;
    int processing = 0;  // requests in slots
    int deferred = 0;    // requests waiting for a slot
    uint64_t requests_finished = 0, requests_cancelled = 0, requests_failed = 0;
    uint64_t prompt_tokens = 0, generated_tokens = 0;
    uint64_t prompt_tokens_cached = 0;  // of prompt_tokens, those a slot's prefix cache held (not prefilled)
    uint64_t longest_sequence = 0;      // the most tokens (prompt and generated) a finished request's sequence held
    double prompt_seconds = 0.0, generation_seconds = 0.0;
    uint64_t steps = 0;
    // Embeddings (embed()): their inputs' tokens, the target forwards that computed them and their time.
    uint64_t embedding_tokens = 0, embedding_forwards = 0;
    double embedding_seconds = 0.0;
    uint64_t gated_steps = 0;            // decoding steps in which the speculation gate allowed no drafts
    std::vector<double> rows_bounds;     // histogram of target-forward rows per step
    std::vector<uint64_t> rows_buckets;  // cumulative counts per bound, last = +Inf
    double rows_sum = 0.0;
    std::vector<uint64_t> busy_slots_steps;  // [k]: steps with k + 1 sequences in the forward
    uint64_t emitted_tokens = 0;             // tokens the steps emitted, counted per step (live, unlike generated_tokens)
    uint64_t drafts = 0, draft_tokens = 0, accepted_tokens = 0;
    std::string failure;                               // non-empty: the target's device failed; every request gets this error (5xx)
    std::vector<uint64_t> accepted_at;                 // [d]: drafts whose token at depth d + 1 was accepted
    SuffixCache::Stats suffix_cache;                   // drafts looked up in earlier requests, and what the cache keeps
    PrefixStore::Stats prefix_store;                   // slots' rows kept in host memory, and their use
    uint64_t graphs_kept = 0, graph_buffer_bytes = 0;  // forward graphs the runners keep, and their compute buffers
    struct Slot {
        int id = 0;
        bool busy = false;
        int n_prompt = 0, n_generated = 0, n_cached = 0;
        std::string tenant;  // of the request the slot serves or last served ("" before its first)
    };
    std::vector<Slot> slot_states;
};

class Scheduler {
public:
    // The target must outlive the scheduler. Measures the verify cost (when the policies need it)
    // before returning.
    Scheduler(ModelBundle & target, SchedulerOptions options);
    ~Scheduler();
    Scheduler(const Scheduler &) = delete;
    Scheduler & operator=(const Scheduler &) = delete;

    // Queues a request; nullptr when the queue is full. The prompt must fit the context with
    // options.n_predict (checked by the caller, which can name the sizes). A SpecEE mode other
    // than Off needs the target's exit predictors, and the lossy mode greedy sampling (Error).
    // Lossless sequences share the step's target forward like any drafter's; a lossy sequence
    // runs its own layer segments on its cache stream after the shared forward, one token per step.
    // `stop`: the request's stop strings (Job).
    // `tenancy`: whose request it is, whose cached prefixes and earlier texts it may reuse.
    // `limits`, `id_slot`: as submit_choices.
    std::shared_ptr<Job> submit(std::vector<int32_t> prompt, const GenerationOptions & options, EarlyExitRequest early_exit = {},
                                std::vector<std::string> stop = {}, Tenancy tenancy = {}, TextLimits limits = {}, int id_slot = -1);
    // A request's n choices (1 <= n <= capacity(); Error otherwise): n jobs, choice i sampled with
    // seed + i. The first starts once min(n, slots) slots are free (the request waits in the queue
    // until then, and the requests behind it too); it prefills the prompt, and the choices that
    // start while it has not yet generated take its cache rows and drafter state
    // (KvCache::copy_from, Drafter::copy_state) instead of prefilling it again (a lossy SpecEE
    // request's choices each prefill). Choices beyond the slots wait in the queue, in order, for
    // slots the earlier ones free. Empty when the queue is full. `limits`: the request's
    // TextLimits; `id_slot`: the slot a one-choice request must run in (-1: any), for which it waits
    // at the queue's head (Error for a slot that does not exist).
    std::vector<std::shared_ptr<Job>> submit_choices(std::vector<int32_t> prompt, const GenerationOptions & options, int n,
                                                     EarlyExitRequest early_exit = {}, std::vector<std::string> stop = {}, Tenancy tenancy = {},
                                                     TextLimits limits = {}, int id_slot = -1);
    // Each input's embedding (SchedulerOptions::embeddings): the target's final hidden states after
    // its output norm, pooled and L2-normalised (server/embeddings.h). The worker computes them
    // between steps, in prefill chunks, in a KV stream of their own; the future fails with Error
    // without --embeddings, for an input that is empty or longer than the context, or when the
    // server stops first.
    std::future<std::vector<std::vector<float>>> embed(std::vector<std::vector<int32_t>> inputs);
    SchedulerMetrics metrics() const;
    int context_size() const;  // tokens per slot
    int capacity() const;      // requests or choices the slots and the queue hold
    // The target's rpc-server failed mid-run (Backend::set_remote_failure_handler): the requests
    // then in slots or queued, and every later one, end with the failure as their error, and the
    // worker thread stays parked in the forward that met it (the process must end without
    // tearing the target down: its devices cannot be released).
    bool failed() const;

private:
    struct Slot;
    void run();
    // A queued job given a free slot by admit(); `first`: the slot of its first choice whose
    // prefilled prompt it takes, else nullptr.
    struct Admitted {
        Slot * slot;
        Slot * first;
    };
    // Under mutex_: queued jobs into free slots (each slot's job set, its sequence not yet made).
    std::vector<Admitted> admit();
    // Under mutex_: ends the cancelled jobs at the queue's front (their clients left while they waited).
    void drop_cancelled_queued();
    // Under mutex_: the free slot the queue's front job starts in now (its id_slot's, else the one
    // holding most of its prompt; prefixes: every slot's), or -1 while it must wait; `first` as may_start sets it.
    int slot_for_front(std::span<const SlotPrefix * const> prefixes, Slot *& first) const;
    // On the worker, without mutex_: sets an admitted slot up for its job (the prefix store's and
    // a first choice's rows, the sequence). Returns the error that fails the job, "" on success.
    std::string start(Slot & slot, Slot * first);
    void fail_start(Slot & slot, const std::string & error);  // under mutex_: ends the job start() could not set up
    // Under mutex_: whether the queue's front job may start now (an n-choice request needs
    // min(n, slots) free slots, and its further choices wait for the first one's prefill); sets `first` to the slot
    // of a further choice's first choice whose prefilled prompt it takes, else nullptr.
    bool may_start(const Job & job, int free_slots, Slot *& first) const;
    void release(Slot & slot, bool finished_normally);
    struct EmbedRequest {
        std::vector<std::vector<int32_t>> inputs;
        std::promise<std::vector<std::vector<float>>> done;
    };
    void start_embeddings();  // the embeddings' KV stream and the output norm's weights
    // On the worker, without mutex_: the requests' forwards in embed_cache_, their answers set;
    // counted into `counts` (embedding_tokens, embedding_forwards, embedding_seconds).
    void run_embeddings(std::deque<EmbedRequest> & requests, SchedulerMetrics & counts);
    // The part of the suffix cache a job's drafts read and its text goes to ("" for all when shared).
    std::string suffix_scope(const Job & job) const;
    // Under mutex_, on the worker: copies each slot's counters to what metrics() reads, since its
    // cache and sequence change outside the mutex while a step runs.
    void publish_slots();
    // The slot's job's prompt progress (Job::report_prompt), at its start and after each step.
    static void report_prompt_progress(Slot & slot);
    // From the failing thread: records the failure, ends every request in a slot or the queue.
    void fail_all(const std::string & failure);
    // Under mutex_, after a step. Ends the slots' requests with `failure` (a 5xx), freeing the slots.
    void fail_step(const std::vector<Slot *> & slots, const std::string & failure, bool client_error = false);
    // Under mutex_: counts a step in the metrics (busy: the slots that decoded in it; gated:
    // drafting was off) and releases the slots whose generation ended.
    void account_step(const std::vector<Slot *> & active, const std::vector<Slot *> & lossy, int busy, const StepResult & step,
                      int lossy_tokens, bool gated);

    ModelBundle & target_;
    SchedulerOptions options_;
    std::vector<std::unique_ptr<Slot>> slots_;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    bool stopping_ = false;
    std::string failure_;  // the target's device failed (failed())
    SchedulerMetrics metrics_;
    uint64_t admitted_ = 0;                  // requests admitted so far: each slot's last_used stamp
    std::unique_ptr<SpeculationGate> gate_;  // null: every step may draft
    // Finished sequences, added on the worker (release) and looked up by the slots' drafters on
    // the worker, each under its job's scope (Tenancy; one scope when shared); null when off or no
    // drafter looks up. metrics() reads its counters (its own mutex).
    std::shared_ptr<SuffixCache> suffix_cache_;
    std::unique_ptr<PrefixStore> store_;    // null when --cache-bytes is 0; saved to and loaded from by the worker, outside mutex_
    std::deque<EmbedRequest> embed_queue_;  // under mutex_
    std::unique_ptr<KvCache> embed_cache_;  // the embeddings' stream (null without them), the worker's
    std::vector<float> output_norm_;        // the target's output norm weights, for the embeddings
    std::thread worker_;
};

}  // namespace specula
