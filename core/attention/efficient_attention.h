// Memory-efficient attention for inference on the CPU: blockwise over queries and keys with an
// online (running max and sum) softmax, never holding a T x T tensor. Takes the same bias
// description as the reference; ALiBi is computed from slopes tile by tile, dense biases
// (T5, KERPLE, FIRE, Sandwich) are requested one tile at a time, a cumulative bias (fox) is
// F[i] - F[j] per tile, and a contextual one (CoPE) counts its gates from the diagonal
// leftwards, carrying each row's sum from tile to tile. Used by attention() for long inference windows
// (AttentionOptions::efficient_threshold); `extrap bench attention` measures it.
#pragma once

#include "core/attention/attention.h"

namespace extrap {

// Rows (queries) and columns (keys) of one score tile; the diagonal tile is
// query_block x query_block. A tile is large enough that its products amortise their calls
// and small enough that a thread's scores stay small: (B*H) x 256 x 512 floats, 4 MB per thread
// for 8 heads. Of the tile shapes compared (benchmarks/RESULTS.md), 256 x 512 is the fastest at
// long windows and close to the fastest at shorter ones.
struct EfficientAttentionBlocks {
  int64_t query_block = 256;
  int64_t key_block = 512;
};

// Same contract as attention_reference(), computed in fp32 and returned in q's dtype, and k and
// v may have fewer heads than q (grouped-query attention: query head h reads key head
// h / (H / H_kv); each tile's products take a key head's group of queries at once, with no copy
// of k and v per query head), except for stick-breaking, PaTH and Self-Extend. CPU tensors only; inference only (throws if grad mode is on and an input or slope requires
// grad; no attention dropout), except stick-breaking, which goes to its row-blocked path with
// its own backward (stick_breaking_attention_blocked, core/attention/stick_breaking.h). A dense bias's function is called once per tile, for tiles on
// and below the diagonal only when causal, and from several threads at once: it must be
// thread-safe (pure tensor indexing is).
// Whether attention_efficient() computes this bias in tiles of one score matrix, and so takes
// k and v of fewer heads than q: not stick-breaking, PaTH or Self-Extend (row blocks of their
// own, one key head per query head), nor a bias that mixes every head's scores (DAPE: refused).
bool efficient_tiles_take(const AttentionBias& bias);

torch::Tensor attention_efficient(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, const AttentionBias& bias,
                                  const AttentionOptions& options,
                                  const EfficientAttentionBlocks& blocks = {});

}  // namespace extrap
