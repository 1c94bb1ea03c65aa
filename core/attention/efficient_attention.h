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
// query_block x query_block. Chosen by measurement on 2026-11-21 on the 2-core development VM
// (Xeon @ 2.1 GHz with AVX-512, LibTorch 1.13.1, OpenBLAS 0.3.21), B 1, H 8, D 64, causal
// ALiBi, one thread, process CPU time in ms (the machine was shared with other jobs; minimum
// of 2 to 5 runs). "default": the generic kernels OpenBLAS picks on this VM's CPU; "skx":
// OPENBLAS_CORETYPE=SkylakeX, 2-4x faster matrix products.
//
//   query x key     T 4096 default   T 4096 skx   T 16384 default   T 16384 skx
//     64 x  512          717            287           12600             5485
//    128 x  256          629            269           11781             5097
//    128 x  512          595            281           10461             5004
//    256 x  256          584            281            9793             5223
//    256 x  512          605            288            9570             5216
//    256 x 1024          603            289           10523             4875
//    512 x  512          824            324           11173             5306
//
// 256 x 512 is best at 16k with the default kernels and within 7% of the best elsewhere.
// Score tiles are then (B*H) x 256 x 512 floats: 4 MB per thread for 8 heads.
struct EfficientAttentionBlocks {
  int64_t query_block = 256;
  int64_t key_block = 512;
};

// Same contract as attention_reference(), computed in fp32 and returned in q's dtype. CPU
// tensors only; inference only (throws if grad mode is on and an input or slope requires
// grad; no attention dropout). A dense bias's function is called once per tile, for tiles on
// and below the diagonal only when causal, and from several threads at once: it must be
// thread-safe (pure tensor indexing is).
torch::Tensor attention_efficient(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, const AttentionBias& bias,
                                  const AttentionOptions& options,
                                  const EfficientAttentionBlocks& blocks = {});

}  // namespace extrap
