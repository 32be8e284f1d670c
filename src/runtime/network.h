#pragma once
// Anything ModelRunner can run: a target/draft language model (Model) or a draft head
// (EagleHead). A network reports its sizes, checks a batch, and builds its graph; the runner
// owns everything else (inputs, mask, KV slots, graph reuse, outputs).
#include <span>

struct ggml_context;
struct ggml_cgraph;

namespace specula {

class Backend;
class KvCache;
struct ForwardBatch;
struct GraphInputs;
struct GraphOutputs;

struct NetworkShape {
    int n_layer = 0;         // layers (layer ranges and taps count these)
    int n_embd = 0;          // residual width (taps, hidden_out)
    int n_embd_kv = 0;       // KV row width
    int n_vocab = 0;         // logit width (a head's draft vocabulary)
    int n_token_vocab = 0;   // valid token ids for inputs
    int sliding_window = 0;  // > 0: some layers attend only to keys fewer than this many positions back
};

class Network {
public:
    virtual ~Network() = default;
    virtual const NetworkShape & shape() const = 0;
    virtual Backend & backend() const = 0;
    // Width of each hidden_in row this batch may carry (0: none allowed); throws Error otherwise.
    virtual void check_hidden_in(const ForwardBatch & batch, int hidden_width) const = 0;
    virtual GraphOutputs build_graph(ggml_context * ctx, ggml_cgraph * gf, KvCache & cache, const GraphInputs & in,
                                     const ForwardBatch & batch, int layer_end) const = 0;
};

}  // namespace specula
