#!/usr/bin/env bash
# Mutation check: does the test suite notice a one-line bug? Applies each mutation below in
# turn (one exact edit of one line), rebuilds, runs the suite until its first failure, and
# restores the file. Prints, per mutation, the first failing test, or MISSED; exits 1 if any
# mutation is missed. Needs a configured build/ (scripts/setup.sh) and takes about 1-2 minutes
# a mutation on 2 cores.
#
#   bash scripts/mutation_check.sh            # all of them
#   bash scripts/mutation_check.sh 3 17       # only these (numbers as listed below)
#   bash scripts/mutation_check.sh --texts    # only check that every text occurs exactly once
#                                             # (seconds; a ctest entry, so that a refactoring
#                                             # that moves a line fails CI, not a later check)
#
# Each entry: file | the exact text | what it becomes | the bug, in words. The text must occur
# exactly once in the file (the script refuses otherwise, so a refactoring that moves a line
# shows up here rather than silently testing nothing).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${EXTRAP_PYTHON:-$ROOT/.venv/bin/python}
[[ -x $PYTHON ]] || PYTHON=python3

MUTATIONS=$(cat <<'EOF'
positions/alibi_slopes.cpp | std::pow(2.0, -8.0 * double(h + 1) / double(n)) | std::pow(2.0, -8.0 * double(h) / double(n)) | ALiBi slope exponent off by one head
core/attention/attention.cpp | auto left = (j <= i); | auto left = (j < i); | the diagonal counted as the right side (causal rows mask themselves)
core/attention/attention.cpp | out = torch::where(left, -sl * dist, -sr * dist); | out = torch::where(left, sl * dist, -sr * dist); | flipped sign of the left-side linear bias
core/attention/attention.cpp | q * (1.0 / std::sqrt(double(d))) | q * (1.0 / double(d)) | scores scaled by 1/d instead of 1/sqrt(d)
core/attention/efficient_attention.cpp | for (int64_t k0 = q1; k0 < p.tk; k0 += key_block) | for (int64_t k0 = q1 + 1; k0 < p.tk; k0 += key_block) | efficient path skips the first key right of each query tile
core/attention/efficient_attention.cpp | narrow(1, 0, cols) + double(q0 - k0); | narrow(1, 0, cols) + double(q0 - k0 + 1); | efficient path's tile distances off by one
positions/t5_bias.cpp | if (relative_position > 0) bucket += num_buckets; | if (relative_position >= 0) bucket += num_buckets; | T5 bidirectional bucket: distance 0 on the wrong side
positions/rotation.cpp | even * cos - odd * sin, even * sin + odd * cos | even * cos + odd * sin, even * sin + odd * cos | rotary rotation with a flipped sign
positions/sinusoidal.cpp | torch::stack({angles.sin(), angles.cos()}, -1) | torch::stack({angles.cos(), angles.sin()}, -1) | sinusoidal sin and cos swapped
positions/learned.cpp | TORCH_CHECK(end <= options_.max_length, | TORCH_CHECK(end < options_.max_length, | learned positions refuse their own max_length
core/eval/evaluator.cpp | windows.push_back({begin, next - begin, end - begin}); | windows.push_back({begin, next - begin, end - begin - 1}); | sliding window scores one target twice
core/eval/evaluator.cpp | if (u < 0.8) { | if (u < 0.9) { | masked-LM corruption 90/0/10 instead of 80/10/10
core/eval/evaluator.cpp | result.nll_sum / (std::log(2.0) * double(result.scored_bytes)) | result.nll_sum / (std::log(10.0) * double(result.scored_bytes)) | bits per byte in the wrong log base
core/train/trainer.cpp | return c.lr * double(step) / double(c.warmup); | return c.lr * double(step + 1) / double(c.warmup); | warm-up off by one step
core/base/files.cpp | if (::fsync(fd) != 0) { | if (false) { | durable write skips its fsync
core/run/checkpoint.cpp | if (hash != entry.at("xxh3").get<std::string>()) | if (false) | checkpoint checksums not compared
core/model/model.cpp | return h + f; | return f; | feed-forward residual dropped
core/results/results_store.cpp | : "sliding_" + std::to_string(stride); | : "sliding_" + std::to_string(length); | sliding mode labelled with the length
experiments/sweep/sweep_spec.cpp | lengths.insert(length_of_multiple(m, point.config.train.seq_len, spec.source, "eval.length_multiples")); | lengths.insert(length_of_multiple(m, point.config.train.seq_len, spec.source, "eval.length_multiples") + 1); | evaluation length mislabelled (multiple x L + 1)
experiments/sweep/point_runner.cpp | p.stride = e.stride > 0 ? e.stride : e.length; | p.stride = e.stride > 0 ? e.stride : 0; | stride column 0 for non-overlapping rows
experiments/sweep/sweep.cpp | if (!done.has_point(point.id, e.mode, e.length)) pending.push_back(e); | pending.push_back(e); | a resumed sweep evaluates recorded points again
analysis/report.py | values.std(ddof=1) | values.std(ddof=0) | report's standard deviation with ddof 0
analysis/report.py | (" (= L)" if l == train_length else "") | (" (= L)" if l == 2 * train_length else "") | report marks the wrong row as the training length
core/export/safetensors.cpp | {"data_offsets", {offset, offset + bytes}}}; | {"data_offsets", {offset, offset + bytes + 1}}}; | exported data offsets one byte past each tensor
core/export/model_export.cpp | yaml_to_json(given ? given : YAML::Load(doc.default_value)) | yaml_to_json(YAML::Load(doc.default_value)) | export records the defaults instead of the options the model was built with
analysis/extrap_model.py | x0, x1 = x[..., 0:d:2], x[..., 1:d:2] | x0, x1 = x[..., :d // 2], x[..., d // 2:d] | Python reference pairs rotary dimensions NeoX-style
analysis/extrap_model.py | bias = -F.softplus(kind.raw_slopes[s]) | bias = -torch.exp(kind.raw_slopes[s]) | Python reference reads learned slopes as exp(raw)
core/attention/attention.cpp | auto p = gates.flip(-1).cumsum(-1).flip(-1).clamp_max(double(npos - 1)); | auto p = gates.cumsum(-1).clamp_max(double(npos - 1)); | CoPE counts gates from the window start instead of back from the query
core/attention/efficient_attention.cpp | gate_carry.add_(gates.sum(-1, /*keepdim=*/true)); | gate_carry.add_(gates.sum(-1, /*keepdim=*/true) * 0); | efficient CoPE forgets the gates of the tiles it visited
core/attention/attention.cpp | out = f.narrow(2, q0, q1 - q0).unsqueeze(-1) - f.narrow(2, k0, k1 - k0).unsqueeze(-2); | out = f.narrow(2, k0, k1 - k0).unsqueeze(-2) - f.narrow(2, q0, q1 - q0).unsqueeze(-1); | forgetting-gate bias F_j - F_i instead of F_i - F_j
positions/xpos.cpp | {cos * up, sin * up, cos * down, sin * down}; | {cos * down, sin * down, cos * down, sin * down}; | xPos scales the query down like the key
positions/sandwich.cpp | double(d / 2);  | double(d);  | Sandwich subtracts d instead of d/2 (no longer 0 at distance 0)
positions/fire.cpp | torch::log1p(c * torch::maximum(i, threshold)) + eps; | torch::log1p(c * threshold) + eps; | FIRE normalises by psi(L) instead of psi(max(L, i))
positions/kerple.cpp | r2_.data().clamp_(range2_.min, range2_.max); | ; | KERPLE's r2 no longer kept in range (power exponent above 2)
positions/alibi.cpp | return b.at_positions(at.positions.sampled); | return b; | ALiBi ignores randomized training positions
core/attention/attention.cpp | .triu(1 + row0); | .triu(1); | a decode step's causal mask not shifted to the end of the keys (queries see no cached key)
core/attention/attention.cpp | return probabilities(q, k, bias, options, k.size(2) - q.size(2)); | return probabilities(q, k, bias, options, 0); | a decode step gets the bias rows of the window's first tokens (the cached-ALiBi bug)
positions/fox.cpp | F = torch::cat({*at.state, F + at.state->narrow(2, -1, 1)}, 2); | F = torch::cat({*at.state, F}, 2); | fox's gate sum restarts at every decode block
positions/xpos.cpp | const double centre = positions.centre >= 0 | const double centre = positions.centre >= 1000000000 | xpos ignores the sequence's centre under a KV cache
positions/rotation.cpp | return (1.0 - gamma) * theta / factor + gamma * theta; | return (1.0 - gamma) * theta * factor + gamma * theta; | YaRN stretches instead of interpolating
positions/rotation.cpp | return {cos * factor, sin * factor}; | return {cos * factor, sin}; | YaRN's attention factor on cos only
core/eval/evaluator.cpp | bin.nll_sum = position_nll.slice(0, bin.begin, bin.end).sum().item<double>(); | bin.nll_sum = position_nll.slice(0, bin.begin, bin.end - 1).sum().item<double>(); | a loss-by-position bin leaves out its last position
core/eval/retrieval_eval.cpp | if (match != AnswerMatch::partial) return match == AnswerMatch::complete; | if (match != AnswerMatch::partial) return true; | retrieval counts an answer right that leaves every right answer
core/eval/retrieval_eval.cpp | for (int64_t p = instance.prompt_length - 1; p < spec.length - 1; ++p) | for (int64_t p = instance.prompt_length; p < spec.length; ++p) | retrieval scores the answer one position late
core/data/retrieval_task.cpp | const double wanted = depth * double(filler); | const double wanted = 0; | the key sentence always goes first (depth ignored)
core/data/retrieval_task.cpp |   out += '.'; |   ; | the answer loses its full stop (a longer number would match)
core/train/trainer.cpp | if (fraction >= 1) return true; | if (fraction >= 1) return false; | data.task_fraction 1 trains on no task instance
core/train/trainer.cpp | const int64_t first_row = group_ ? group_->rank() * share : 0; | const int64_t first_row = 0; | every data-parallel rank trains on the first share of the batch
core/train/trainer.cpp | all_reduce_gradients(*group_, model_->parameters(), what); | ; | data-parallel gradients are never summed (the ranks drift apart)
core/eval/evaluator.cpp | if (ranks && ++batch_number % ranks->size() != ranks->rank()) continue; | if (ranks && ++batch_number % ranks->size() == ranks->rank() + 1) continue; | data-parallel evaluation scores some batches on two ranks
core/runtime/distributed.cpp | if (r != rank() && probe->add("beat/" + std::to_string(r), 0) == before[size_t(r)]) | if (r != rank() && probe->add("beat/" + std::to_string(r), 0) != before[size_t(r)]) | a dead rank is not named (the live ones are)
core/attention/attention.cpp | if (Float32Region fp32(q.device().type()); fp32.was_autocast()) | if (Float32Region fp32(q.device().type()); false) | under train.precision bf16 the attention scores (and the bias) are bfloat16
core/train/trainer.cpp | ComputePrecision region(precision, inputs.device().type()); | ComputePrecision region(Precision::fp32, inputs.device().type()); | train.precision bf16 silently trains in fp32
core/model/config.cpp | if (config.train.precision == Precision::fp32) remove_key(out, "train.precision"); | ; | every earlier run directory changes identity (fp32 joins the fingerprint)
core/attention/fused_cpu_attention.cpp | qi, qr.stride, 1.0f, dkr.data + k0 * dkr.stride, | qi, qr.stride, 0.0f, dkr.data + k0 * dkr.stride, | the fused CPU attention keeps only the last query block's key gradients
core/attention/fused_cpu_attention.cpp | last = p.causal | last = false | the fused CPU attention lets a causal symmetric bias see the future
core/kernels/bf16_gemm.cpp | const __mmask16 mask = width >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << width) - 1); | const __mmask16 mask = __mmask16(0xFFFF); | the bf16 products write past the last column of C
core/kernels/bf16_gemm.cpp | {0,  16, 1,  17, 2,  18, | {16, 0,  1,  17, 2,  18, | packing a float32 B swaps the first column's pair of rows
core/attention/fused_cpu_attention.cpp | multiply(gt, pb, D, n, 1.0f, dvt.data(), T, true);  // dV^T += dO^T P | multiply(gt, pb, D, n, 1.0f, dvt.data(), T, false);  // dV^T += dO^T P | the bf16 attention keeps only the last query block's value gradients
core/attention/fused_cpu_attention.cpp | const float delta = dot(prob + r * stride, row, n); | const float delta = dot(prob + r * stride, prob + r * stride, n); | the fused CPU attention's softmax backward shifts by rowsum(P P), not rowsum(P dP)
core/kernels/fused_cpu_loss.cpp | out[target[i]] -= g; | out[target[i]] -= 1.0f; | the fused loss's gradient at the target ignores the incoming scale (1 / tokens scored)
core/kernels/fused_cpu_loss.cpp | std::fill(out, out + V, 0.0f); | std::fill(out, out + V, 1e-3f); | rows the loss ignores (masked LM's unmasked tokens) still get a gradient
core/kernels/bf16_gemm.cpp | if (odd_depth && p == pairs - 1) bv[v] | if (false && odd_depth && p == pairs - 1) bv[v] | an odd-depth product lets the next row of B (NaN, inf) into C
core/base/allocator.cpp | mallopt(M_TRIM_THRESHOLD, int(AllocatorTuning::trim_threshold)) == 1; | true; | malloc keeps trimming the heap after each step (its pages fault in again)
core/kernels/cpu_linear.cpp | out[2] = linear_bias_gradient(g).to(torch::ScalarType(ctx->saved_data["bias_dtype"].toInt())); | out[2] = linear_bias_gradient(g).div(g.size(0)).to(torch::ScalarType(ctx->saved_data["bias_dtype"].toInt())); | the oneDNN linear's bias gradient averages over rows instead of summing
core/kernels/cpu_linear.cpp | : onednn_product(x.t(), g.t(), {}).t().contiguous(); | : onednn_product(x.t(), g.t(), {}).contiguous().view({M, K}); | the oneDNN linear's weight gradient (computed transposed) reshaped instead of transposed
core/kernels/fused_adamw.cpp | const float pi = p[i] * u.decay; | const float pi = p[i]; | the fused AdamW forgets the weight decay
core/kernels/fused_adamw.cpp | const float g = grad[i] * u.scale; | const float g = grad[i]; | the fused AdamW ignores gradient clipping
core/kernels/fused_adamw.cpp | scale = std::isnan(coefficient) ? coefficient : std::min(1.0f, coefficient); | scale = std::min(1.0f, coefficient); | a NaN gradient norm steps the finite parameters unclipped (clip_grad_norm_ makes them all NaN)
core/kernels/cpu_vector_math.h | slope = cdf + x * e * 0.39894228040143268f; | slope = cdf; | GELU's slope without its x phi(x) term
core/kernels/gelu_linear.cpp | out[0] = onednn_product(g, w.t(), {}, slope); | out[0] = onednn_product(g, w.t(), {}); | the fused GELU's input gradient without GELU's slope
core/kernels/residual_norm.cpp | dbeta[j] += du[j]; | dbeta[j] += du[j] * xhat[j]; | the fused LayerNorm's bias gradient summed as its weight's
core/kernels/residual_norm.cpp | dx[j] = dh[j] + rstd * (du[j] * gamma[j] - a - xhat[j] * b); | dx[j] = rstd * (du[j] * gamma[j] - a - xhat[j] * b); | the residual's own gradient dropped where the LayerNorm's joins it
core/kernels/residual_norm.cpp | std::sqrt(squares / float(D) + eps) | std::sqrt(squares / float(D - 1) + eps) | the fused LayerNorm with the unbiased variance
core/kernels/qkv_heads.cpp | auto slot = packed.narrow(2, first[i], count[i]).permute({0, 2, 1, 3}); | auto slot = packed.narrow(2, first[2 - i], count[2 - i]).permute({0, 2, 1, 3}); | split_heads' copied gradients put q's where v's belongs
core/kernels/qkv_heads.cpp | if (x->size(i) > 1 && x->stride(i) != strides[size_t(i)]) return false; | if (false) return false; | slices of a wider buffer taken for packed q, k, v
core/kernels/qkv_heads.cpp | return {slice(0, H), slice(H, Hkv), slice(H + Hkv, Hkv)}; | return {slice(0, H), slice(H + Hkv, Hkv), slice(H + Hkv, Hkv)}; | attention kernels write dK over dV in the packed gradient
core/kernels/cpu_linear.cpp | for (int64_t i = blk * kSumRows; i < std::min(N, (blk + 1) * kSumRows); ++i) | for (int64_t i = blk * kSumRows; i < std::min(N, (blk + 1) * kSumRows) - 1; ++i) | the bfloat16 bias gradient skips the last row of each block
core/kernels/residual_norm.cpp | if (lowp) narrow(out, lowp + i * D, D); | if (lowp) narrow(hp + i * D, lowp + i * D, D); | the LayerNorm's bfloat16 copy rounds h instead of u
core/kernels/residual_norm.cpp | b.du_low = grads[first_u + 1].to(torch::kBFloat16).contiguous(); | b.du_low = torch::Tensor(); | the bfloat16 copy's gradient dropped
core/attention/fused_cpu_attention.cpp | last = std::min(keys.last, k0 + n - 1) - i; | last = std::min(keys.last, k0 + n) - i; | the fused CPU attention's softmax counts a row's padding past the last key
core/attention/fused_cpu_attention.cpp | const float wall = d < first | const float wall = d < first - 1.0f | the fused CPU attention lets a row see one key left of its window or chunk
core/attention/fused_cpu_attention.cpp | for (int64_t l = 0; l < kLanes; ++l) total += sum[l]; | for (int64_t l = 1; l < kLanes; ++l) total += sum[l]; | the softmax's sum drops one lane of every group
core/kernels/bf16_gemm.cpp | std::memcpy(row + 2 * j, bits(src + j * ld + k), 2 * sizeof(uint16_t)); | std::memcpy(row + 2 * j, bits(src + j * ld + k), sizeof(uint16_t)); | packing a transposed bfloat16 B drops the second row of each pair
core/kernels/cpu_vector_math.h | auto* bits = reinterpret_cast<uint16_t*>(to + r * to_stride); | auto* bits = reinterpret_cast<uint16_t*>(to + r * n); | narrow_rows() writes its rows at their own width, not the destination's stride
core/eval/evaluator.cpp | auto t = flat_targets.index_select(0, scored.narrow(0, c, len)); | auto t = flat_targets.index_select(0, scored.narrow(0, 0, len)); | every logit chunk of a batch scored against the first chunk's targets
core/data/token_cache.cpp | header.source_bytes == key.source_bytes && header.source_hash == key.source_hash; | header.source_bytes == key.source_bytes; | the token cache trusts its source's size alone (a same-size edit reuses stale tokens)
experiments/sweep/sweep_spec.cpp | length_of_multiple(m, point.config.train.seq_len, spec.source, "eval.retrieval.length_multiples")); | length_of_multiple(m, spec.base_config.train.seq_len, spec.source, "eval.retrieval.length_multiples")); | retrieval instance lengths from the base config's training length, not the grid point's
core/train/trainer.cpp | (part / divisor).backward(); | if (a == 0) (part / divisor).backward(); | only the first micro-batch of an accumulated step reaches the gradient
core/eval/retrieval_eval.cpp | const TaskInstance& instance = trials[first + size_t(b)].instance; | const TaskInstance& instance = trials[size_t(b)].instance; | every retrieval batch is fed the first batch's instances
core/attention/fused_cpu_attention.cpp | const int64_t block = turn % 2 == 0 ? turn / 2 : blocks - 1 - turn / 2; | const int64_t block = turn % 2 == 0 ? turn / 2 : blocks - 2 - turn / 2; | the inference kernel computes one query block twice and never the last
core/runtime/cuda_support.cpp | if (mode == "0") return {State::switched_off, "EXTRAP_LOAD_CUDA=0"}; | if (mode == "x") return {State::switched_off, "EXTRAP_LOAD_CUDA=0"}; | EXTRAP_LOAD_CUDA=0 does not keep CUDA out
core/attention/fused_cpu_attention.cpp | return double(distance) > negligible_distance(reach, -coefficient); } | return double(distance) > negligible_distance(reach, -coefficient) / 16; } | the inference kernel skips key tiles of a linear bias that are not negligible
core/train/trainer.cpp | state.loss_sum = checkpoint->state.pending_loss_sum; | state.loss_sum = 0; | a resumed run's first log point forgets the steps before the checkpoint
core/run/metrics_log.cpp | } else if (line_step > step) { | } else if (false) { | a resumed run keeps the metrics lines written after its checkpoint
core/model/memory_estimate.cpp | return add(add(parameters, gradients), add(optimizer, activations)); | return parameters + gradients + optimizer + activations; | the memory estimate wraps negative for an absurd model and accepts it
experiments/sweep/sweep.cpp | if (run.point_index == found->second->index) continue; | continue; | a grown sweep leaves recorded runs at their old places in the grid
experiments/sweep/sweep_spec.cpp | out["base"] = spec["base"]; | ; | a sweep with another base config counts as the same sweep grown
experiments/sweep/point_runner.cpp | out.reused = summary.resumed_from == summary.steps; | out.reused = false; | a finished checkpoint loaded to evaluate counts as trained now
core/data/corpus.cpp | value >= vocab_size) | value > vocab_size) | a pre-tokenised id equal to data.vocab_size is taken (it is <mask>)
core/attention/attention.cpp | options = options.dtype(out_dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32); | options = options.dtype(out_dtype); | a bfloat16 bias formed from bfloat16 positions (wrong past 256)
core/eval/evaluator.cpp | if (counts_bytes) by[b][p] = corpus.bytes_at(stream, target_at); | if (counts_bytes) by[b][p] = 1; | bits per byte of pre-tokenised or subword text count tokens, not the bytes behind them
core/data/sentencepiece.cpp | const size_t start = out.ids.size() == first + 1 ? 0 : std::min<size_t>(piece.begin(), line.size); | const size_t start = std::min<size_t>(piece.begin(), line.size); | a line's leading whitespace credited to no token (bits per byte over fewer bytes than the text)
core/data/sentencepiece.cpp | out.bytes.push_back(int32_t(line.break_bytes + (empty ? line.size : 0))); | out.bytes.push_back(int32_t(line.break_bytes)); | a whitespace-only line's bytes credited to no token
core/data/corpus.cpp | identity += '\0' + hex64(model_hash); | ; | two SentencePiece models share one cache folder (each load rebuilds the other's splits)
experiments/sweep/sweep.cpp | moved.back().point_index = now->point_index; | moved.back().point_index = run.point_index; | a merged grown sweep leaves the earlier stage's runs at their old places in its grid
positions/rotation.cpp | if (pairs >= 0) frequencies = frequencies.narrow(0, 0, pairs); | if (pairs >= 0) frequencies = frequencies.narrow(0, frequencies.size(0) - pairs, pairs); | p-RoPE keeps the lowest frequencies instead of the highest
analysis/extrap_model.py | theta = [base ** (-2.0 * i / self.d_head) for i in range(m)] | theta = [base ** (-2.0 * i / (2 * m)) for i in range(m)] | Python's p-RoPE squeezes rotary's frequencies into the kept pairs (rotary's fraction)
core/attention/attention.cpp | return torch::softmax(torch::cat({scores, column}, -1), -1).narrow(-1, 0, scores.size(-1)); | return torch::softmax(scores, -1) + 0 * column.sum(); | the reference drops the sink from the softmax's denominator
core/attention/efficient_attention.cpp | running_sum.fill_(1.0); | running_sum.fill_(0.0); | the efficient path keeps the sink's logit in the maximum but not its e^0 in the sum
core/attention/attention.cpp | return (1 + left + right).expand({num_heads, tq}).contiguous(); | return (2 + left + right).expand({num_heads, tq}).contiguous(); | SSMax's n_i off by one (ln(n + 1))
core/attention/attention.cpp | ((i - j).abs() >= window) | ((i - j).abs() > window) | the sliding window lets in one key too many
core/attention/attention.cpp | const bool window_masks = window > 0 && nearest >= window; | const bool window_masks = window > 0 && nearest + 1 >= window; | the efficient path skips the tile holding a window's farthest key
core/attention/attention.cpp | (i.div(chunk, "floor") != j.div(chunk, "floor")) | ((i + 1).div(chunk, "floor") != j.div(chunk, "floor")) | chunk boundaries of queries and keys one token apart
core/attention/attention.cpp | .masked_fill(masked, -inf); | ; | SSMax at n_i = 1 (factor 0) unmasks every key of the row
core/model/model.cpp | const auto factor = 1 + a * torch::log(torch::floor((p + 1) / double(options.extras().temperature_floor)) + 1); | const auto factor = 1 + a * torch::log(torch::floor(p / double(options.extras().temperature_floor)) + 1); | Llama 4's temperature floors p instead of p + 1
core/model/model.cpp | auto g = torch::sigmoid(linear(gate, input)).view({B, T, H, -1}); | auto g = torch::sigmoid(linear(gate, input)).view({B, T, -1, H}).transpose(2, 3); | the element-wise gate's channels go to the wrong heads
core/attention/fused_cpu_attention.cpp | if (!p.sink.empty()) sum += std::exp(p.sink[size_t(h)] - max); | ; | the fused kernel keeps the sink in the row's maximum but not in its sum
core/attention/fused_cpu_attention.cpp | first = std::max(first, i - (p.window - 1)); | first = std::max(first, i - p.window); | the fused kernel's window lets in one key too many on the left
core/attention/fused_cpu_attention.cpp | if (grads.sink) *grads.sink -= std::exp(p.sink[size_t(h)] - lse[i0 + r]) * delta; | if (grads.sink) *grads.sink += std::exp(p.sink[size_t(h)] - lse[i0 + r]) * delta; | the fused kernel's sink gradient has the wrong sign
core/attention/fused_cpu_attention.cpp | sum += dz[t] * (raw[t] + (d < 0.0f ? left : right) * d); | sum += dz[t] * raw[t]; | the fused kernel's logit-scale gradient leaves out the bias
core/attention/fused_cpu_attention.cpp | return {row_keys(p, h, i0).first, row_keys(p, h, i0 + m - 1).last + 1}; | return {row_keys(p, h, i0 + m - 1).first, row_keys(p, h, i0 + m - 1).last + 1}; | the fused kernel's block starts at its last row's first key (earlier rows lose keys)
core/model/model.cpp | .layer_index(plan.layer_index[l]) | .layer_index(l) | a pattern's layer takes its depth for its number among its kind's layers (another layer's parameters)
core/model/config.cpp | plan.layer_index.push_back(seen[k]++); | plan.layer_index.push_back(seen[k]); | every layer of a kind is numbered as its first
core/model/config.cpp | const int64_t k = pattern_kind[l % period]; | const int64_t k = pattern_kind[(l + 1) % period]; | the layer pattern shifted by one layer
core/model/model.cpp | forward_residual(x, delta, *positions_[plan_.layer_kind[l]], positions, | forward_residual(x, delta, *positions_[0], positions, | every layer takes the first kind's position method
core/model/model.cpp | forward(x, *positions_[plan_.layer_kind[l]], positions, attention_options, | forward(x, *positions_.front(), positions, attention_options, | cached decoding takes the first kind's position method in every layer
core/model/config.cpp | LayerKind kind{name, c.position_name, c.position, "position", c.model.attention_options}; | LayerKind kind{name, c.position_name, c.position, "position", AttentionConfig()}; | a layer kind drops the attention section's options
core/model/model.cpp | if (method->set_rope_scaling(scaling)) scaled = true; | if (!scaled && method->set_rope_scaling(scaling)) scaled = true; | RoPE scaling stops at the first kind with rotary angles
core/export/model_export.cpp | {"attention", attention_json(kind.attention)}}; | {"attention", attention_json(config.model.attention_options)}}; | export gives every kind of a layer pattern the top-level attention options
core/model/memory_estimate.cpp | const AttentionConfig& a = plan.kinds[kind].attention; | const AttentionConfig& a = c.model.attention_options; | the estimate counts the attention section's options where a layer kind has its own
analysis/extrap_model.py | factor = attention.ssmax.view(1, H, 1, 1) * torch.log(n) | factor = attention.ssmax.view(1, H, 1, 1) * torch.log(n + 1) | Python's SSMax counts one key more than the row sees
analysis/extrap_model.py | hidden = torch.logical_or(hidden, (i - j).abs() >= W) | hidden = torch.logical_or(hidden, (i - j).abs() > W) | Python's sliding window lets one key more in
positions/sampling.cpp | positions.narrow(0, start[c], length - start[c]).add_(skip[c] - shifted); | positions.narrow(0, start[c], length - start[c]).add_(skip[c]); | PoSE adds each skip on top of the last instead of its rise over it
positions/sampling.cpp | torch::randint(0, range - length + 1, {chunks - 1} | torch::randint(0, range - length + 2, {chunks - 1} | PoSE's last position can reach the target
positions/sampling.cpp | narrow(0, 0, chunks - 1) + 1).sort()); | narrow(0, 0, chunks - 1)).sort()); | PoSE can cut before the first token (an empty first chunk)
positions/dape.cpp | torch::linear(x, w1.to(x.scalar_type()), b1.to(x.scalar_type())), 0.01); | torch::linear(x, w1.to(x.scalar_type()), b1.to(x.scalar_type())), 0.2); | DAPE's LeakyReLU has the wrong negative slope
core/attention/attention.cpp | const auto finite_base = base.masked_fill(base.isinf(), 0); | const auto finite_base = base; | DAPE's MLP reads the base's masked entries as -inf
core/attention/attention.cpp | scores = scores + base + mixed + materialize_bias_block( | scores = scores + mixed + materialize_bias_block( | DAPE's logits leave out the base bias B
core/attention/attention.cpp | return inference && q.device().is_cpu() && bias.kind != AttentionBias::Kind::ScoreMixing && | return inference && q.device().is_cpu() && | Auto sends a long DAPE evaluation to the efficient path, which refuses it
positions/dape.cpp | parts.push_back(f(scores.narrow(2, r, n), base.narrow(1, r, n))); | parts.push_back(f(scores.narrow(2, r, n), base.narrow(1, 0, n))); | DAPE's evaluation blocks read the first rows' base bias
core/attention/stick_breaking.cpp | auto visible = bias.stick_breaking_diagonal ? j <= i : j < i; | auto visible = j <= i; | stick-breaking lets every query take its own key
core/attention/stick_breaking.cpp | const auto log_stay = torch::log_sigmoid(-rows.z) | const auto log_stay = torch::log_sigmoid(rows.z) | stick-breaking multiplies by sigmoid(z) instead of 1 - sigmoid(z) for the nearer keys
core/attention/stick_breaking.cpp | return torch::matmul(weights, v) + remaining * v.narrow(2, k.size(2) - q.size(2), q.size(2)); | return torch::matmul(weights, v); | stick-breaking drops the remaining mass on the query's own value
core/attention/efficient_attention.cpp | if (bias.kind == AttentionBias::Kind::StickBreaking | if (bias.kind == AttentionBias::Kind::Householder | the efficient path runs stick-breaking as softmax tiles
core/attention/householder.cpp | const auto k_hat = K - torch::matmul(U.transpose(-1, -2), beta_rows * W); | const auto k_hat = K; | PaTH's keys are not carried to the end of their block
core/attention/householder.cpp | const auto u = Q - torch::matmul(reach, own(Y));   // q^ | const auto u = Q;   // q^ | PaTH's queries are not carried to the start of their block
core/attention/householder.cpp | if (back + 1 < nb) carried = torch::matmul(carried, G.narrow(2, key_block, count)); | if (false) carried = torch::matmul(carried, G.narrow(2, key_block, count)); | PaTH skips the reflections of the blocks between query and key
core/attention/householder.cpp | * Beta.unsqueeze(-2)).masked_fill(below.logical_not(), 0) + | * Beta.unsqueeze(-1)).masked_fill(below.logical_not(), 0) + | PaTH's within-block system weighs each reflection by the wrong beta
core/attention/attention.cpp | rows.logit_scale = bias.logit_scale.narrow(1, r, n); | rows.logit_scale = bias.logit_scale.narrow(1, 0, n); | PaTH's row blocks read the first rows' logit scale
core/attention/attention.cpp | ? householder_scores(scaled, k, bias.householder_w, bias.householder_beta) | ? torch::matmul(scaled, k.transpose(-2, -1)) | PaTH's reference path ignores the reflections
positions/path.cpp | w = w * torch::rsqrt(w.pow(2).sum(-1, /*keepdim=*/true) + 1e-6); | w = w * torch::rsqrt(w.pow(2).sum(-1, /*keepdim=*/true) + 1e-2); | PaTH's w is normalised with the wrong epsilon
positions/path.cpp | auto beta = 2 * torch::sigmoid( | auto beta = torch::sigmoid( | PaTH's beta lies in (0, 1), not (0, 2)
positions/path.cpp | torch::constant_pad_nd(w.transpose(1, 2), {size - 1, 0}); | torch::constant_pad_nd(w.transpose(1, 2), {0, size - 1}); | PaTH's short convolution sees the next tokens
positions/rotation.cpp | const double low = std::max(std::floor(dimension(s.beta_fast)), 0.0); | const double low = std::max(dimension(s.beta_fast), 0.0); | yarn does not round its correction range down as Hugging Face does
positions/rotation.cpp | return interpolated * theta / factor + (1.0 - interpolated) * theta; | return (1.0 - interpolated) * theta / factor + interpolated * theta; | yarn's ramp interpolates the fast pairs and keeps the slow ones
core/model/model.cpp | if (kind.attention.sink && method->bias(layer_window(0, 2)).kind | if (false && method->bias(layer_window(0, 2)).kind | a sink with stick_breaking passes the config checks and fails only at the first step
analysis/extrap_model.py | after = log_stay.flip(-1).cumsum(-1).flip(-1) - log_stay  # sum over k > j | after = log_stay.flip(-1).cumsum(-1).flip(-1)  # sum over k > j | Python's stick-breaking weights count each key's own 1 - sigmoid
analysis/extrap_model.py | u[:, :, j:] = rows - beta[:, :, j, None, None] * (rows * wj).sum(-1, keepdim=True) * wj | u[:, :, j:] = rows - (rows * wj).sum(-1, keepdim=True) * wj | Python's PaTH reflections ignore beta
core/attention/attention.cpp | bias.near_window;  // (Tq, Tk) | bias.near_window + 1;  // (Tq, Tk) | Self-Extend keeps one more distance at its trained position than its window says
positions/registry.cpp | if (queries) g = g + (neighbor_window - neighbor_window / group_size); | if (queries) g = g + neighbor_window; | Self-Extend's grouped query positions leave out - floor(W / G)
core/model/model.cpp | positions.grouped(/*queries=*/true), x}); | positions.grouped(/*queries=*/false), x}); | Self-Extend's far queries take the keys' grouped positions
core/eval/evaluator.cpp | while (G < T && (T - 1) / G + W - W / G > L - 1) ++G; | while (G < T && (T - 1) / G + W - W / G > L) ++G; | Self-Extend's default group size lets a distance reach L
core/data/retrieval_task.cpp | const auto first = std::lower_bound(starts.begin(), starts.end(), placements.back().at); | const auto first = starts.begin(); | variable tracking's later assignments may come before the ones they copy
core/data/retrieval_task.cpp |       if (used[n]) continue; |  | variable tracking accepts a name written twice
core/data/retrieval_task.cpp |   return last(instance.answer_stop, at); |   return AnswerMatch::complete; | variable tracking ignores what follows the names
core/eval/retrieval_eval.cpp |       sequence[size_t(instance.prompt_length) + g] = generated[g]; |       sequence[size_t(instance.prompt_length) + g] = instance.answer[g]; | decoding on past a departure reads the instance's own answer, not the tokens chosen
core/data/retrieval_task.cpp |     const bool capitals = current.size() > 1 && |     const bool capitals = current.size() > 9 && | word level writes a variable's name as one word
core/data/retrieval_task.cpp |     if (task == RetrievalTask::multikey) names.assign(std::begin(kKeyNames), std::end(kKeyNames)); |     names.assign(std::begin(kKeyNames), std::end(kKeyNames)); | passkey refuses a word vocabulary without multikey's names
core/eval/longppl.cpp | const auto candidate = long_eval.token_position.ge(k) | const auto candidate = long_eval.token_position.ge(k - 1) | LongPPL's candidates include targets with only K tokens of context
core/eval/longppl.cpp | keys.key = candidate.logical_and(gain.gt(spec.alpha)) | keys.key = candidate.logical_and(gain.ge(spec.alpha)) | LongPPL takes a gain of exactly alpha as key
core/eval/longppl.cpp | .logical_and(long_eval.token_nll.neg().gt(spec.beta)); | .logical_and(short_eval.token_nll.neg().gt(spec.beta)); | LongPPL's beta floor reads the short context's log-probability
core/eval/evaluator.cpp | tokens->position.index_put_({stream_at}, where + 1); | tokens->position.index_put_({stream_at}, where); | the evaluator's token positions are one short
core/eval/longppl.cpp |   spec.stride = 1; |   spec.stride = 2; | LongPPL's short context shares windows between targets
core/eval/longppl.cpp | out.longppl = std::exp(out.nll_sum / double(out.key_tokens)); | out.longppl = std::exp(out.nll_sum / double(out.candidates)); | LongPPL averages over the candidates, not the key tokens
core/model/model.cpp | const auto recent = torch::arange(S - W + 1, 1, index_options) | const auto recent = torch::arange(S - W, 0, index_options) | StreamingLLM's recent keys end one token before the query
core/model/model.cpp | /*last_queries=*/1); | /*last_queries=*/2); | StreamingLLM keeps the second-last row of each cache window
core/model/model.cpp | slots.sampled = torch::arange(length, torch::kLong).clamp_max(streaming_.cache - 1); | slots.sampled = torch::arange(length, torch::kLong); | StreamingLLM embeds absolute positions at the text position, not the cache slot
core/model/model.cpp | const auto sinks = torch::arange(S, index_options).unsqueeze(0); | const auto sinks = torch::arange(1, S + 1, index_options).unsqueeze(0); | StreamingLLM's sinks skip the stream's first token
core/eval/evaluator.cpp |     model_->set_streaming(streaming_); |     (void)streaming_; | an evaluation leaves the model streaming
core/eval/evaluator.cpp |     if (spec.stride > 0 && spec.stride < spec.length) |     if (spec.stride > spec.length) | StreamingLLM takes a sliding stride
experiments/sweep/point_runner.cpp |     spec.streaming = e.streaming; |     (void)e.streaming; | a sweep's streaming mode evaluates without the cache
experiments/sweep/sweep_spec.cpp | if (cache < length) { | if (cache <= length) { | a sweep lists StreamingLLM at a length its cache holds whole
experiments/sweep/sweep_spec.cpp | e.longppl = scores_longppl && stride == 0 && length > short_length; | e.longppl = scores_longppl && stride == 0 && length >= short_length; | a sweep scores LongPPL at the training length (no target has more than K tokens of context)
experiments/sweep/point_runner.cpp |     spec.alpha = settings_.alpha; |     (void)settings_.alpha; | a sweep's LongPPL ignores eval.longppl.alpha
experiments/sweep/point_runner.cpp |     TransformerLM& selector = reference_ ? reference_->model : model; |     TransformerLM& selector = model; | a sweep's LongPPL ignores eval.longppl.reference (each model selects its own key tokens)
experiments/sweep/sweep_spec.cpp |     if (!before["eval"]["longppl"]) after["eval"].remove("longppl"); |     (void)before; | a results file without LongPPL refuses to grow once LongPPL is on by default
analysis/report.py |             values = [math.exp(r["key_nll_sum"] / r["key_tokens"]) for r in records if r["key_tokens"] > 0] |             values = [math.exp(r["key_nll_sum"] / r["candidates"]) for r in records if r["key_tokens"] > 0] | report's LongPPL averages over the candidates, not the key tokens
core/eval/attention_profile.cpp |     if (!causal) weight_sums( |     if (false) weight_sums( | the attention profile of a masked LM (a dense bias) leaves out every key after the query
core/eval/attention_profile.cpp | std::min(keys, i - edges[b] + 1), sums); | std::min(keys, i - edges[b]), sums); | the attention profile (a dense bias) leaves each bin's nearest distance out
core/eval/attention_profile.cpp | mass.select(1, 0).add_(rest.sum(batch_and_rows)); | (void)rest; | the attention profile drops stick-breaking's rest of each row (the query's own value)
core/eval/attention_profile.cpp | sink_[layer_].add_(rest.sum(batch_and_rows)); | (void)sink_; | the attention profile records no sink share
core/attention/attention.cpp |                            tk - tq + r)); |                            tk - tq)); | attention weights in row blocks placed as if every block were the first rows
experiments/sweep/point_runner.cpp |       spec.split_at = config.train.seq_len; |       spec.split_at = 0; | a sweep's attention profile has no bin edge at the training length
experiments/sweep/point_runner.cpp |       spec.windows = e.profile_windows; |       spec.windows = e.profile_windows + 1; | a sweep's attention profile reads one window more than eval.attention_profile.windows
core/results/results_store.cpp | c.begin, c.end, c.mass, c.entropy, c.sink}); | c.begin, c.end, c.mass, c.mass, c.sink}); | the results file records each profile bin's mass as its entropy
experiments/sweep/sweep_spec.cpp |   if (out.empty()) out = {train_length, longest}; |   if (out.empty()) out = {longest}; | a sweep profiles each point at its longest length only, not at L
experiments/sweep/sweep_spec.cpp |     if (e["attention_profile"]) eval["attention_profile"]["windows"] = e["attention_profile"]["windows"]; |     (void)e; | a sweep grows with other attention-profile windows than its recorded ones
analysis/report.py | if edges[b] >= train_length] | if edges[b] > train_length] | report's mass past L leaves out the bin that starts at L
analysis/report.py |             maps[m] = (seeds[0][0], np.mean([mass.mean(1) for _, mass, _, _ in seeds], axis=0)) |             maps[m] = (seeds[0][0], np.mean([mass.max(1) for _, mass, _, _ in seeds], axis=0)) | report's profile heat map shows each layer's largest head, not the mean over heads
core/eval/attention_profile.cpp | const float z = (s[t] + (d >= 0 ? -slope_left * d : slope_right * d) + gate) * scale; | const float z = (s[t] + (d >= 0 ? slope_left * d : slope_right * d) + gate) * scale; | the attention profile's own softmax adds ALiBi's bias with the wrong sign
core/eval/attention_profile.cpp | const float gate = kCumulative ? ci - cumulative[t] : 0.0f; | const float gate = kCumulative ? cumulative[t] - ci : 0.0f; | the attention profile's own softmax adds the forget gates' F_j - F_i instead of F_i - F_j
core/eval/attention_profile.cpp | double z_sum = has_sink ? std::exp(double(sink) - double(top)) : 0.0; | double z_sum = 0.0; | the attention profile's own softmax leaves the sink out of its denominator
core/eval/attention_profile.cpp | entropy[b] = (e_sum * log_z - ex_sum) / z_sum; | entropy[b] = (e_sum * log_z + ex_sum) / z_sum; | the attention profile's entropy adds z - m instead of subtracting it
core/attention/attention.cpp | first = std::max(first, i - (window - 1)) | first = std::max(first, i - window) | a query's span of keys (the attention profile's softmax, SSMax's n) reaches one key past the sliding window
core/attention/attention.cpp | if (chunk > 0) first = i / chunk * chunk, | if (chunk > 0) first = std::max<int64_t>(0, (i / chunk - 1) * chunk), | a query's span of keys (the attention profile's softmax, SSMax's n) starts a chunk early
core/eval/attention_profile.cpp | if (rb.linear && rb.look_left[size_t(h)] == 0) lo = std::max(lo, i); | if (false) lo = std::max(lo, i); | the attention profile's own softmax lets a right-looking ALiBi head look left
core/eval/attention_profile.cpp | rb.scale.empty() ? 1.0f : rb.scale[size_t(h * tq + r + t)] | 1.0f | the attention profile's own softmax ignores SSMax's logit scale
core/eval/attention_profile.cpp | profile_exp_sums(s, std::max(lo, i + std::max<int64_t>(edges[b], 1)) | (void)0, (s, std::max(lo, i + std::max<int64_t>(edges[b], 1)) | the attention profile's own softmax of a masked LM leaves out every key after the query
core/kernels/cpu_vector_math.h |   y += -0.5f * z; |   y += -0.25f * z; | log_float's second-order term halved (the profile's entropies of dense biases drift)
core/model/config.cpp |   refuse_untaken_position(c, plan); |   (void)plan; | a layer pattern silently ignores a top-level position that no layer takes
core/model/config.cpp |       if (kind.position_name == c.position_name) return; |       (void)kind; | a layer pattern refuses a top-level position naming a method the pattern uses
experiments/cli/cli_inspect.cpp |   description.window = window; |   description.window = 0; | inspect bias draws no sliding-window mask
core/model/model.cpp | bias.logit_scale.narrow(1, T - last_queries, last_queries); | bias.logit_scale.narrow(1, 0, last_queries); | StreamingLLM's last query takes SSMax's scale of the window's first row
analysis/extrap_model.py | hidden_keys = masks[self.layer_kind[layer]] | hidden_keys = masks[0] | Python masks every layer with the first kind's window and chunk
analysis/extrap_model.py | row = (self.layer_kind[layer], kind.bias_row(index)) | row = (self.layer_kind[layer], kind.bias_row(0)) | Python reads row 0 of a kind's per-layer bias tables in each of its layers
core/export/model_export.cpp | json::parse(resolved_position_options(kind.position_name, kind.position)) | json::parse(resolved_position_options(config)) | export gives each kind of a layer pattern the top-level position's options
analysis/extrap_model.py | hidden = F.leaky_relu(x @ kind.w1[index].T + kind.b1[index], 0.01) | hidden = F.relu(x @ kind.w1[index].T + kind.b1[index]) | Python's DAPE MLP with ReLU instead of LeakyReLU(0.01)
core/export/model_export.cpp | out[doc.key] = given && given.IsMap() ? yaml_to_json(given) : json::object(); | out[doc.key] = json::object(); | export drops DAPE's base_options (the base is rebuilt with its defaults)
core/eval/attention_profile.cpp | rb.offsets.data_ptr<float>() + h * rb.offsets.size(1) + (tk - 1 - i) | rb.offsets.data_ptr<float>() + h * rb.offsets.size(1) + (tk - i) | the profile reads a bias by offset one key off
positions/distance_bias.h | torch::arange(lo, hi, options.dtype(torch::kLong)).abs() - nearest | torch::arange(lo, hi, options.dtype(torch::kLong)) - lo | KERPLE and Sandwich biases by signed offset instead of distance
core/attention/fused_cpu_attention.cpp | rb.offsets = p.offsets.data() + h * p.offset_stride + kOffsetPad + (k0 - i) + (p.length - 1); | rb.offsets = p.offsets.data() + h * p.offset_stride + kOffsetPad + (i - k0) + (p.length - 1); | the fused kernel reads a bias by offset mirrored (i - j for j - i)
core/attention/fused_cpu_attention.cpp | const float s = (group[l] + bias) * factor + wall; | const float s = group[l] * factor + bias + wall; | the fused kernel leaves a bias by offset out of the logit scale
core/kernels/fused_adamw.cpp | at::_foreach_mul_(grads, torch::clamp(clip / (total + 1e-6), std::nullopt, 1.0)); | at::_foreach_mul_(grads, clip / (total + 1e-6)); | the GPU's optimiser step scales gradients up when their norm is under the clip
core/kernels/fused_adamw.cpp | shared = torch::full({}, static_cast<double>(state.step()), | shared = torch::full({}, static_cast<double>(state.step() - 1), | the GPU's optimiser step bias-corrects with the previous step count
core/kernels/fused_adamw.cpp | beta1, beta2, options.weight_decay(), options.eps(), /*amsgrad=*/false, | beta1, beta2, 0.0, options.eps(), /*amsgrad=*/false, | the GPU's optimiser step forgets the weight decay
core/attention/fused_cpu_attention.cpp | if (grads.offsets) add_row(grads.offsets + kOffsetPad + (k0 - i) + (p.length - 1) + begin, row + begin, end - begin); | if (grads.offsets) add_row(grads.offsets + kOffsetPad + (p.length - 1) + begin, row + begin, end - begin); | the fused backward adds every row's bias gradient from offset 0 (its keys' columns, not their offsets j - i)
core/attention/fused_cpu_attention.cpp | dot(row + begin, rb.offsets + begin, end - begin) | 0.0f | the fused backward leaves a bias by offset out of the logit scale's gradient
core/attention/fused_cpu_attention.cpp | return doffsets.sum(0).narrow(1, kOffsetPad, by_offset.size(1)).to(by_offset.scalar_type()); | return doffsets.sum(0).narrow(1, kOffsetPad + 1, by_offset.size(1)).to(by_offset.scalar_type()); | the fused backward hands back a bias by offset's gradient shifted by one offset
core/attention/stick_breaking.cpp | auto dz = (w - torch::sigmoid(rows.z) * w.cumsum(-1)) | auto dz = (w - torch::sigmoid(rows.z) * (w.cumsum(-1) - w)) | stick-breaking's blocked backward leaves a key's own weight out of the stay factor's gradient
core/attention/stick_breaking.cpp | dv.narrow(2, first + r, n).add_(gb * (1 - rows.weights.sum(-1, true))); | dv.narrow(2, first + r, n).add_(gb); | stick-breaking's blocked backward gives the query's own value the whole gradient, not the remaining mass's
core/attention/stick_breaking.cpp | if (scale_grad) dscale.narrow(1, r, n).add_((dz * rows.logits).sum(-1).sum(0)); | if (scale_grad) dscale.narrow(1, r, n).add_((dz * rows.z).sum(-1).sum(0)); | stick-breaking's blocked backward takes the logit scale's gradient from the scaled logits
core/attention/stick_breaking.cpp | dk.narrow(2, 0, keys).add_(torch::matmul(dz.transpose(-2, -1), qf.narrow(2, r, n)) * scale); | dk.narrow(2, 0, keys).copy_(torch::matmul(dz.transpose(-2, -1), qf.narrow(2, r, n)) * scale); | stick-breaking's blocked backward keeps only the last row block's share of each key's gradient
core/attention/stick_breaking.cpp | wr[j] += after; | wr[j] += after + stay[size_t(j - lo)]; | stick-breaking's CPU rows multiply each key's weight by its own 1 - sigmoid too
core/attention/stick_breaking.cpp | hi = bias.stick_breaking_diagonal ? span.second + 1 : std::min(span.second + 1, i); | hi = span.second + 1; | stick-breaking's CPU rows let every query take its own key
core/attention/fused_cpu_attention.cpp | constexpr double kNegligible = 64.0; | constexpr double kNegligible = 4.0; | the fused kernel and the attention profile skip ALiBi's keys that weigh up to e^-4 of the row's largest
core/eval/attention_profile.cpp | std::ceil(double(first + n - 1) + negligible_distance(reach, slope_right))) + 1 | std::ceil(double(first + n - 1) + negligible_distance(reach, slope_right) / 8)) + 1 | the attention profile of a masked LM skips ALiBi's keys to the right at an eighth of their distance
core/eval/attention_profile.cpp | if (stick_breaking)  // the rest of each row goes to the query's own value | if (false)  // the rest of each row goes to the query's own value | the attention profile's forward pass gives stick-breaking's rest of each row to no value (later layers see another model)
core/eval/attention_profile.cpp | output.narrow(2, r, n).copy_(o); | output.narrow(2, std::max<int64_t>(0, r - 1), n).copy_(o); | the attention profile's forward pass places each block of output rows one row early
core/attention/attention.cpp | std::max<int64_t>(1, kDenseChunkPairs / std::max<int64_t>(1, q1 - q0)); | std::max<int64_t>(1, 2 * kDenseChunkPairs / std::max<int64_t>(1, q1 - q0)); | a dense bias's function is asked for twice the pairs at once (FIRE's intermediates leave the cache)
core/kernels/fused_adamw.cpp | if (!counters.empty()) at::_foreach_add_(counters, 1); | ; | a captured optimiser step no longer advances AdamW's device step counters (every replay repeats one bias correction)
core/attention/attention.cpp | const auto left_seen = *looks_left ? torch::ones_like(left) : diagonal; | const auto left_seen = *looks_left ? diagonal : torch::ones_like(left); | a linear bias whose heads all look left hides every earlier key (the device-built direction mask inverted)
core/train/trainer.cpp | loss = loss.defined() ? loss + share : share; | loss = share; | an accumulated step's logged loss is its last micro-batch's, not their mean
core/attention/stick_breaking.cpp | const auto hidden = visible_keys(bias, keys - n, keys, qf.device()).logical_not(); | const auto hidden = torch::zeros({n, keys}, torch::kBool); | stick-breaking's blocked backward sends gradient to keys a row cannot see (the diagonal, the future, beyond a window)
experiments/sweep/sweep_spec.cpp | if (__builtin_mul_overflow(multiple, train_length, &length)) | if (__builtin_mul_overflow(multiple, train_length, &length) && false) | a length multiple past 64 bits is evaluated at a wrapped (negative or small) length
experiments/sweep/sweep_spec.cpp | if (inner.key.rfind(outer.key + ".", 0) == 0) | if (false) | grid axes position and position.name both set the method, the inner one silently winning under the outer one's label
experiments/sweep/sweep_spec.cpp |     if (!fresh) |     if (false) | grid values spelt differently (seed 1 and 01) train one model twice, pooled as seeds
experiments/sweep/sweep.cpp | if (!close(a.perplexity, b.perplexity, 1e-9)) return | if (false) return | merge keeps the first file's perplexity where two files disagree on it
core/train/trainer.cpp | if (step == 1) state.first_loss = step_loss; | ; | a wide model's untrained loss (above 2 ln V) is called divergence at step 1
core/train/trainer.cpp | if (valid_tokens < window) | if (false) | a validation split that cannot fill one window is found only at the first validation, after training
core/runtime/sysinfo.cpp | requested > kMostThreads) | requested > (int64_t(1) << 40)) | a thread count no CPU has reaches the thread pools (100,000 segfaulted)
core/run/metrics_log.cpp | } else if (line_step <= previous) { | } else if (line_step < previous) { | a resumed run keeps a duplicated metrics.jsonl line
core/run/metrics_log.cpp | out.prefix = out.prefix && kept_bytes == end - line.size(); | out.prefix = true; | a resumed run cuts metrics.jsonl to the kept size where it skipped a line (valid lines lost, garbage kept)
core/run/checkpoint.cpp | const SharedFileLock reading(swap_lock_path(run_dir), SharedFileLock::Mode::shared); | ; | eval of a training run reads its checkpoint mid-swap (missing, corrupt or newer weights)
core/base/yaml_options.cpp | if (!added) | if (false) | a YAML key given twice silently takes one of its values
experiments/sweep/sweep.cpp | if (was.data_key == now.data_key && !was.tokens.empty() && !now.tokens.empty() && was.tokens != now.tokens) | if (false) | a grown sweep pools numbers of an edited validation text with the recorded ones
experiments/sweep/sweep.cpp | if (was_run == now_run && !was.model.empty() && !now.model.empty() && was.model != now.model) | if (false) | a run trained again adds its numbers to those of the weights it replaced
core/eval/evaluator.cpp | const AttentionBackend backend = model->attention_backend(); | const AttentionBackend backend = m.attention; | eval --attention reference skips the memory refusal and aborts
core/eval/retrieval_eval.cpp | check_instance_memory(spec.length, instances); | ; | retrieval instances of any length are built before memory is checked
core/run/run_dir.cpp | if (recorded != checkpoint.manifest.fingerprint) | if (false) | a checkpoint copied into another run's directory is evaluated as that run
core/train/trainer.cpp | if (state.step == c.steps && !state.checkpoint()) save_run(state); | ; | train.steps 0 writes eval.json without a checkpoint
experiments/cli/cli_common.cpp | if (option.string_key.empty()) | if (false) | a stray positional argument is dropped without a word
core/base/yaml_options.h | if (!std::isfinite(field)) fail( | if (false) fail( | .inf accepted in a number key where .nan is refused
core/train/trainer.cpp | if (c.schedule == Schedule::cosine_restarts) return fairseq_cosine(c, step - 1); | if (c.schedule == Schedule::cosine_restarts) return fairseq_cosine(c, step); | fairseq's cosine schedule one update early
core/model/adaptive.cpp | parts.push_back(head.narrow(1, c0 + k - 1, 1) + tail_log_probs(h, k)); | parts.push_back(tail_log_probs(h, k)); | a tail word's log-probability without its band's
core/model/adaptive.cpp | torch::where(band.eq(0), t, band + (c0 - 1)); | torch::where(band.eq(0), t, band + (c0 - 2)); | a tail target's band read from the wrong head column
core/train/optimizer.cpp | for (auto& p : parameters) p.mul_(1 - lr * config.weight_decay); | for (auto& p : parameters) p.mul_(1 - config.weight_decay); | NAG's decoupled weight decay not scaled by the rate
core/train/optimizer.cpp | .nesterov(true) | .nesterov(false) | NAG stepping as heavy-ball momentum
core/model/model.cpp | return delta.defined() ? x + delta : x; | return x; | without a final LayerNorm, the last block's FFN output dropped
core/model/model.cpp | torch::nn::init::xavier_uniform_(part, 1.0 / std::sqrt(2.0)); | torch::nn::init::xavier_uniform_(part, 1.0); | fairseq's q, k, v initialisation without its gain
core/model/model.cpp | const bool dropout = training && activation_dropout > 0; | const bool dropout = false; | activation dropout never applied
core/attention/attention.cpp | return inference && q.size(2) >= options.fused_cpu_min_length && q.scalar_type() == torch::kFloat32 && | return inference && q.size(2) > options.fused_cpu_min_length && q.scalar_type() == torch::kFloat32 && | evaluation takes the fused kernel from one query past its minimum
core/run/run_dir.cpp | if (fs::exists(dir / "fingerprint.yaml", error)) return dir; | if (false) return dir; | --json (and a sweep's --out) overwrites a run directory's own files
core/train/trainer.cpp | before != c.validate_tokens && !checkpoint->state.valid_curve.empty()) | false) | a resumed run mixes validation curves measured on different tokens
positions/t5_bias.cpp | torch::arange(lo, hi, by_offset.options()).clamp_(-reach, reach).add_(reach); | torch::arange(lo, hi, by_offset.options()).clamp_(-reach, reach).add_(reach - 1); | T5's device buckets read one offset to the left
core/base/files.cpp | if (fstatat(dir, name, &status, AT_SYMLINK_NOFOLLOW) != 0) return fail(0); | if (fstatat(dir, name, &status, 0) != 0) return fail(0); | remove_tree follows a link to a directory into what it points to
core/train/trainer.cpp | if (state.leader && start == RunStart::resume && !checkpoint) say_restarted_log(c.out_dir); | if (false) say_restarted_log(c.out_dir); | a resume without a checkpoint retrains from step 0 without a word
core/results/results_store.cpp | fs::file_size(target, error) > 0 && H5Fis_hdf5(target.c_str()) <= 0) | fs::file_size(target, error) > 0 && false) | a sweep's --out over a file that is not HDF5 is not refused before its lock is made
core/attention/gpu_routes.cpp | if (!bias.paper_slopes) return "the slopes are not the paper's (learned, or set by hand)"; | ; | cuDNN's own slopes replace slopes that are not the paper's on a GPU
core/attention/gpu_routes.cpp | if (!options.causal) why = "its ALiBi mask and band are used causally only"; | if (false) why = "its ALiBi mask and band are used causally only"; | a bidirectional ALiBi call goes to cuDNN's causal-only mask
positions/alibi.cpp | torch::equal(slopes_.detach().cpu(), paper); | true; | alibi still claims the paper's slopes after a checkpoint or a plugin wrote others
core/attention/gpu_routes.cpp | if (bias.is_none() && kernels.new_routes) { | if (bias.is_none()) { | SDPA, not yet run on a GPU, taken without EXTRAP_GPU_NEW_ROUTES=1
core/attention/gpu_routes.cpp | if (why.empty() && !kernels.new_routes) why = not_yet; | ; | cuDNN's ALiBi, not yet run on a GPU, taken without EXTRAP_GPU_NEW_ROUTES=1
core/kernels/cuda/residual_norm_kernels.cuh | for (int w = 0; w < kWarps; ++w) total += scratch[w]; | for (int w = 0; w < 1; ++w) total += scratch[w]; | the CUDA LayerNorm's block sums count the first warp only
core/kernels/cuda/residual_norm_kernels.cuh | for (int64_t b = 0; b < p.blocks; ++b) total += p.partial[b * 2 * p.width + j]; | for (int64_t b = 1; b < p.blocks; ++b) total += p.partial[b * 2 * p.width + j]; | the CUDA LayerNorm's weight gradients leave out the first block's rows
core/kernels/cuda/residual_norm_kernels.cuh | if (p.dh) dx = p.dh[first + j] + dx; | if (p.dh) dx = dx; | the residual's own gradient dropped in the CUDA LayerNorm's backward
core/kernels/cuda/simt_host.h | word += 0x7fffu + ((word >> 16) & 1u); | word += 0u; | the SIMT emulation's bfloat16 truncates instead of rounding to nearest even
core/kernels/cuda/cross_entropy_kernels.cuh | s.rest = (s.at_max + s.rest) * simt::exp(s.max - x); | s.rest = s.rest * simt::exp(s.max - x); | the CUDA loss forgets the terms at the old maximum when a larger logit comes
core/kernels/cuda/cross_entropy_kernels.cuh | if (j == target) out -= g; | if (j == target + 1) out -= g; | the CUDA loss's gradient subtracts the one-hot at the next class
core/kernels/cuda/cross_entropy_kernels.cuh | for (int w = 1; w < kWarps; ++w) | for (int w = 1; w < kWarps - 1; ++w) | the CUDA loss's row sum leaves out the last warp's logits
core/kernels/cuda/cross_entropy_kernels.cuh | for (int i = 0; i < kThreads; ++i) total += partial[i]; | for (int i = 1; i < kThreads; ++i) total += partial[i]; | the CUDA loss's total leaves out the first thread's rows
core/base/yaml_options.cpp | if (decimal) return "'" + text + "' (a leading zero: integers are written in decimal without one)"; | if (decimal) return ""; | an integer with a leading zero read as octal (seed 010 trained as 8)
analysis/report.py | if not (ppl == expected or (math.isfinite(ppl) and math.isfinite(expected) | if False and not (ppl == expected or (math.isfinite(ppl) and math.isfinite(expected) | the report takes a perplexity that is not exp(nll_sum / scored_tokens)
analysis/report.py | if bin_tokens != tokens or abs(bin_nll - nll) > 1e-9 * max(abs(nll), 1.0): | if bin_tokens != tokens: | the report takes loss-by-position bins whose NLL does not add up to their point
core/run/run_dir.cpp | remove_stale_temporaries(path_);  // of a process killed mid-write (config.yaml.tmp.<pid>) | ;  // of a process killed mid-write | a killed writer's config.yaml.tmp.<pid> stays in the run directory
analysis/report.py | if key in seen: | if False: | the report pools two rows of one (run, mode, length) as two seeds
core/runtime/distributed.cpp | if (!the_command_line.empty()) the_group->check_same("command line", the_command_line); | ; | ranks started with different commands or flags run on into collectives that do not match
experiments/cli/cli_train.cpp | ranks->check_same("checkpoint or data", YAML::Dump(identity)); | ; | data-parallel eval over two different copies of a run prints their mixed sum as one run's
core/run/run_dir.cpp | const bool owned = first.rfind("checkpoint", 0) == 0 | const bool owned = first.rfind("checkpoint", 0) == 99 | export --overwrite replaces the run's own checkpoint/model.pt
core/train/trainer.cpp | return double(total) / double(std::max<int64_t>(batches[a].scored, 1)); | return double(batches.size()); | an accumulated step is the mean of its micro-batches' means (a masked LM's tokens weighed by their micro-batch)
core/train/trainer.cpp | batch.scored = batch.targets.ne(-100).sum().item<int64_t>(); | batch.scored = batch.targets.ne(-100).sum().item<int64_t>() / state.world; | each rank divides its NLL by its own tokens: data-parallel gradients the world size times one process's (AdamW hides it; NAG does not)
core/eval/retrieval_eval.cpp | for (const auto& [filler, at] : placements) alike = alike && at[c] == at[e]; | for (const auto& [filler, at] : placements) alike = false; | retrieval depths that place the key alike shown as separate measurements
core/run/metrics_log.cpp | if (k < kept.lines.size() && kept.lines[k].first == at) continue; | continue; | a metrics log cut by hand resumes without its missing steps, unsaid
core/runtime/distributed.cpp | if (const size_t advice = out.find(" This is typically caused by"); advice != std::string::npos) { | if (const size_t advice = out.find(" This is typically caused by"); false) { | gloo's advice ("GLHF!") rides on extrap's rank-failure lines
core/model/model.cpp | hasher.add(values.data_ptr(), size_t(values.nbytes())); | hasher.add(values.data_ptr(), size_t(values.numel())); | the weights digest covers each tensor's first bytes only (elements counted as bytes)
experiments/sweep/point_runner.cpp | tokens.add(&n, sizeof n).add(stream.data(), size_t(n) * sizeof(int32_t)); | tokens.add(&n, sizeof n).add(stream.data(), size_t(n)); | the evaluated tokens' identity covers their first quarter (a token count taken as bytes)
core/data/corpus.cpp | id["train"] = hex64(content_hash(train.data(), size_t(train.size()) * sizeof(int32_t))); | id["train"] = hex64(content_hash(train.data(), size_t(train.size()))); | the corpus identity covers the first quarter of the training tokens
analysis/extrap_model.py | model.check_window(length) | pass | the Python reader prints its table before a length its learned positions cannot take is refused
core/kernels/cpu_vector_math.h | slope = sigma * (1.0f + x * (1.0f - sigma)); | slope = sigma * (1.0f + x * sigma); | SiLU's slope wrong in the fused SwiGLU's backward
core/kernels/glu_linear.cpp | dg[j] = ds[j] * u[j] * slope; | dg[j] = ds[j] * slope; | the fused GLU's gate gradient forgets the up projection's value
core/kernels/residual_norm.cpp | const float a = rms ? 0.0f : sum_g / float(D), b = sum_gx / float(D); | const float a = sum_g / float(D), b = sum_gx / float(D); | the fused RMSNorm's backward subtracts the mean gradient as LayerNorm's does
core/attention/fused_cpu_attention.cpp | const int64_t kvh = h / p.group(); | const int64_t kvh = h % p.kv_heads; | the fused forward gives query heads their key heads round-robin (repeat_kv groups consecutive heads)
core/attention/attention.cpp | FullHeads out{k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), bias}; | FullHeads out{k.repeat({1, group, 1, 1}), v.repeat({1, group, 1, 1}), bias}; | the other paths tile the key heads instead of repeating each for its group
positions/rotation.cpp | turned = torch::cat({first * cos - second * sin, first * sin + second * cos}, -1); | turned = torch::cat({first * cos + second * sin, first * sin + second * cos}, -1); | the half pairing rotates with a flipped sign
core/model/config.cpp | return (width + ffn_multiple - 1) / ffn_multiple * ffn_multiple; | return width / ffn_multiple * ffn_multiple; | Llama's feed-forward width rounded down, not up
core/model/model.cpp | return {x + a, feed_forward(ffn_input, attention_options)}; | return {x, feed_forward(ffn_input, attention_options)}; | the parallel block drops its attention branch
core/model/model.cpp | k = k_norm->forward(k.to(torch::kFloat32)).to(v.scalar_type()); | k = q_norm->forward(k.to(torch::kFloat32)).to(v.scalar_type()); | QK-norm normalises k with q's gain
analysis/extrap_model.py | k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1) | k, v = k.repeat(1, H // Hkv, 1, 1), v.repeat(1, H // Hkv, 1, 1) | the Python reader tiles the key heads instead of repeating each for its group
analysis/extrap_model.py | u = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) | u = x * torch.rsqrt(x.var(-1, keepdim=True) + self.eps) | the Python reader's RMSNorm subtracts the mean
core/kernels/rotate_pairs.cpp | out[p + P] = a * sn + b * c[p]; | out[p + P] = a * sn - b * c[p]; | the fused half-pairing rotation's second half with a flipped sign
core/kernels/rotate_pairs.cpp | return rotate(x, cos, sin, rotated, half, 1.0f); | return rotate(x, cos, sin, rotated, half, -1.0f); | the fused rotation turns by the negative angles forward
core/hub/hf_checkpoint.cpp | rows(x.narrow(1, group, 1)), rows(x.narrow(1, group + 1, 1))}, 0); | rows(x.narrow(1, group + 1, 1)), rows(x.narrow(1, group, 1))}, 0); | BLOOM's, GPT-NeoX's and Falcon's fused q, k, v read with k and v swapped
core/hub/hf_checkpoint.cpp | hf.model["block"] = c.get<bool>("use_parallel_residual", true) ? "parallel" : "sequential"; | hf.model["block"] = c.get<bool>("use_parallel_residual", true) ? "sequential" : "parallel"; | GPT-NeoX's residual pattern swapped
core/hub/hf_checkpoint.cpp | : concatenated({s + "mlp.gate_proj.weight", s + "mlp.up_proj.weight"}, {F, F}); | : concatenated({s + "mlp.up_proj.weight", s + "mlp.gate_proj.weight"}, {F, F}); | Llama's gate and up projections swapped
core/model/model.cpp | const auto scaled = config_.scale_embedding ? x * std::sqrt(double(config_.d_model)) : x; | const auto scaled = x * std::sqrt(double(config_.d_model)); | model.scale_embedding false still scales the embedding
core/model/model.cpp | return activation == Activation::relu ? torch::relu(t) : torch::gelu(t, "tanh"); | return activation == Activation::relu ? torch::relu(t) : torch::gelu(t); | gelu_tanh computed as the exact GELU
core/hub/safetensors_reader.cpp | throw ConfigError(what + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + | (void)(what + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + | a tensor past the end of a truncated safetensors file is read
positions/alibi.cpp | if (bf16_product) b = b.to(torch::kBFloat16).to(torch::kFloat32);  // Falcon's bf16 product | ; | Falcon's products m j kept in float32 instead of rounded to bfloat16
positions/rotary.cpp | tables_.set_scaling(scaling.active() ? scaling : built_in_); | tables_.set_scaling(scaling); | evaluation without RoPE scaling drops the checkpoint's built-in scaling
core/hub/hf_checkpoint.cpp | torch::cat({part(0, q, group), part(q, k, 1), part(q + k, k, 1)}, 1); | torch::cat({part(0, q, group), part(q + k, k, 1), part(q, k, 1)}, 1); | export --format hf writes the fused q, k, v with k and v swapped
core/data/hf_tokenizer.cpp | case MetaspacePrepend::each: prepend = !at_start | case MetaspacePrepend::each: prepend = 1 + 0 * !at_start | Llama 2's Prepend "▁" put before a piece that continues a span after a parallel cut
core/data/hf_tokenizer.cpp | (s_.word_cuts && uint8_t(word_.back()) < 0x80) | (s_.word_cuts) | SentencePiece-style BPE cut before every "▁", splitting runs of spaces that merge ("▁▁")
core/data/hf_tokenizer.cpp | symbols.back().end = uint32_t(i); | symbols.push_back({*s_.unk, 0, 0, uint32_t(i), true}); | unknown characters in a row not fused into one <unk> (fuse_unk ignored)
experiments/sweep/point_runner.cpp | if (const auto d = first_difference(checkpoint.config.result_keys(), point.config.result_keys())) | if (const auto d = std::optional<YamlDifference>()) | a released sweep evaluates whatever import its run directory holds, not the model of that name
analysis/report.py | if run.get("released"):  # a released checkpoint: its name, and the method it was mapped to | if False: | the report labels a released checkpoint by its method only, not its name
core/model/model.cpp |       out.narrow(0, r, c).copy_(part); |       out.narrow(0, std::min(r, rows - chunk), c).copy_(part); | evaluation's feed-forward writes its last row chunk over the one before
core/data/hf_tokenizer.cpp |     covered_ = 0; |     covered_ = covered_; | encode_pieces credits a later piece's bytes from where the piece before it ended
core/runtime/block_cache.cpp |         free_.erase(found); |         (void)found; | the block cache hands out a reused block and keeps it on its free list, for a second tensor
core/runtime/block_cache.cpp | while (!free_.empty() && stats_.maps - free_.back().freed_at > options_.kept_for) { | while (false) { | the block cache never unmaps a freed block that is not asked for again
core/export/hf_export.cpp | for (int c = 0; c < b; ++c) code += printable(c) ? 0 : 1; | for (int c = 0; c <= b; ++c) code += printable(c) ? 0 : 1; | the exported byte tokenizer maps the unprintable bytes one character on (its ids are no longer the bytes)
analysis/modeling_extrap.py | return {"input_ids": input_ids, "attention_mask": attention_mask} | return {"input_ids": input_ids[:, -1:], "attention_mask": attention_mask} | remote code's generate() passes only the last token, as if a key-value cache held the rest
core/run/import_run.cpp | if (!hf.vocabulary_hash.empty() && hex64(corpus.vocabulary_hash()) != hf.vocabulary_hash) | if (false) | an imported remote-code folder is evaluated on a corpus of another vocabulary
analysis/tokenization_extrap.py | return [w for line in _lines(text) for w in line.split() + ["<eos>"]] | return [w for line in _lines(text) for w in line.split()] | the exported word-level tokenizer ends no line in <eos>
core/attention/fused_cpu_attention.cpp | const int64_t QB = tiles.query_block, KT = tiles.key_tile, blocks = (T + QB - 1) / QB; | const int64_t QB = tiles.query_block, KT = tiles.key_tile, blocks = T / QB; | the inference kernel drops a length's last partial block of queries
analysis/extrap_model.py | if not self.unigram:  # BPE and the other types: the library's own encode | if True: | the exported SentencePiece tokenizer encodes a unigram model with Python sentencepiece 0.2's rounding, not extrap's
core/hub/hf_checkpoint.cpp |       sliding[l] = on && types[l] == "sliding_attention"; |       sliding[l] = false; | an imported Qwen2's layer_types lose their sliding windows
core/attention/fused_cpu_attention.cpp |     for (int32_t l = 0; l < int32_t(kLanes); ++l) { |     for (int64_t l = 0; l < kLanes; ++l) { | the fused attention's bias loop counts lanes in int64, which leaves it scalar on AVX2 paths
core/eval/attention_profile.cpp |   for (int32_t t = 0; t < count; ++t) { |   for (int64_t t = 0; t < count; ++t) { | the attention profile's linear-bias loops count keys in int64, which leaves them scalar on AVX2 paths
core/hub/hf_checkpoint.cpp | for (const int64_t w : *windows) types.push_back(w > 0 ? "sliding_attention" : "full_attention"); | for (const int64_t w : *windows) types.push_back("full_attention"); | a Qwen2 folder exported with sliding windows on some layers names every layer full attention
core/hub/hf_checkpoint.cpp | multi_query = falcon_flag(c, "multi_query", true), | multi_query = falcon_flag(c, "multi_query", false), | a Falcon config without multi_query read as multi-head (transformers' default is multi-query)
analysis/extrap_model.py | self.arch["norm_bias"] = m.get("norm_bias", self.arch["bias"]) | self.arch["norm_bias"] = self.arch["bias"] | the Python reader ignores model norm_bias (a format-4 export's norms lose their biases)
core/hub/hf_checkpoint.cpp | {"bias", m.bias}, {"multi_query", !new_decoder && Hkv == 1}, | {"bias", m.bias}, {"multi_query", false}, | a multi-query model exported to Falcon's class as multi-head
core/hub/hf_checkpoint.cpp | plan[e + "attention.q_norm.weight"] = norm(s + "self_attn.q_norm.weight"); | plan[e + "attention.q_norm.weight"] = norm(s + "self_attn.k_norm.weight"); | an imported Qwen3's q norm takes the k norm's weights
core/hub/hf_checkpoint.cpp | const int64_t from = c.get<int64_t>("max_window_layers", 28); | const int64_t from = c.get<int64_t>("max_window_layers", 0); | a Qwen2 or Qwen3 config without max_window_layers windows every layer (transformers: from layer 28 on)
core/hub/hf_checkpoint.cpp | olmo) c["attention_bias"] = false; | olmo) c["attention_bias"] = true; | a Qwen3, Gemma or OLMo folder exported with attention biases it has no weights for
core/model/config.cpp | if (config.model.head_dim * config.model.heads == config.model.d_model | if (true | a run's identity leaves out its heads' width (model.head_dim)
core/hub/hf_checkpoint.cpp | qwen3.head_dim = 128; | qwen3.head_dim = 0; | a Qwen3 config without head_dim read with heads of hidden_size / num_attention_heads (Qwen3Config: 128)
core/export/model_export.cpp | : m.d_head() * m.heads != m.d_model ? "extrap-safetensors/5" | : false ? "extrap-safetensors/5" | an export with heads of their own width written as format 4, which a reader of 4 misreads
core/hub/hf_checkpoint.cpp | {m.d_head() * H == m.d_model, "heads other than d_model / heads wide (model.head_dim)"}, | {true, "heads other than d_model / heads wide (model.head_dim)"}, | a Falcon block with heads of their own width exported to Falcon's class, which computes d_model / heads
core/model/memory_estimate.cpp | per_layer = add(per_layer, mul(b, add(add(add(q, mul(2, d)), mul(2, kv)), | per_layer = add(per_layer, mul(b, add(add(add(d, mul(2, d)), mul(2, kv)), | the parameter estimate counts q's bias d_model wide, not heads x head_dim
positions/rotation.cpp | const std::vector<double>& ext = double(current_length) > L ? s.long_factor : s.short_factor; | const std::vector<double>& ext = double(current_length) > L ? s.short_factor : s.long_factor; | LongRoPE takes its short factors past the original length and its long ones inside it
positions/rotation.cpp | return s.factor > 1.0 ? std::sqrt(1.0 + std::log(s.factor) / std::log(double(s.original_length))) : 1.0; | return 1.0; | LongRoPE without its default attention factor sqrt(1 + ln s / ln L)
core/hub/hf_checkpoint.cpp | : c.has("original_max_position_embeddings") ? double(positive(c, "original_max_position_embeddings")) | : false ? double(positive(c, "original_max_position_embeddings")) | a top-level original_max_position_embeddings (Phi-3's) ignored for the scaling's own or the class default
core/hub/hf_checkpoint.cpp | if (rules.su_and_yarn_are_longrope && (type == "su" | if (false && (type == "su" | Phi-3's rope_type su no longer read as longrope
core/hub/hf_checkpoint.cpp | scaling == "longrope" ? int64_t(number("scaling_length", 0)) : config.train.seq_len; | config.train.seq_len; | a Phi-3 export's original_max_position_embeddings is its training length, not LongRoPE's original length
core/hub/hf_checkpoint.cpp | hf.position.remove("fraction");  // as transformers: ignored | (void)0; | an imported Llama with a partial_rotary_factor rotates part of each head, where transformers' class rotates all of it
core/hub/hf_checkpoint.cpp | return {{name}, [](const std::vector<torch::Tensor>& t) { return t[0].to(torch::kFloat32) + 1.0; }, | return {{name}, [](const std::vector<torch::Tensor>& t) { return t[0].to(torch::kFloat32); }, | Gemma's norm weights imported without the 1 its RMSNorm adds
core/hub/hf_checkpoint.cpp | [](const torch::Tensor& x) { return std::vector<torch::Tensor>{x - 1.0}; }}; | [](const torch::Tensor& x) { return std::vector<torch::Tensor>{x}; }}; | Gemma's norms exported without taking off the 1 its RMSNorm adds
core/hub/hf_checkpoint.cpp | if (kin.gelu_is_tanh && act == "gelu") act = "gelu_pytorch_tanh"; | if (false) act = "gelu_pytorch_tanh"; | a Gemma config's hidden_act gelu read as GELU's erf form, not the tanh form GemmaConfig makes it
core/hub/hf_checkpoint.cpp | hf.model["scale_embedding"] = true;  // times sqrt(hidden_size) | hf.model["scale_embedding"] = false;  // times sqrt(hidden_size) | an imported Gemma's embedding not scaled by sqrt(hidden_size)
core/hub/hf_checkpoint.cpp | out.embedding_scale = m.scale_embedding && !m.tie_embeddings ? std::sqrt(double(D)) : 1.0; | out.embedding_scale = m.scale_embedding ? std::sqrt(double(D)) : 1.0; | a Gemma export scales its tied embedding in its weights and again in its class
core/kernels/cpu_vector_math.h | slope = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x2); | slope = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + c * x2); | the fused GeGLU's tanh-form slope drops the 3 of the derivative of x^3
core/model/model.cpp | : activation == Activation::gelu_tanh ? GluGate::gelu_tanh | : false ? GluGate::gelu_tanh | geglu gates with GELU's erf form whatever model.activation says
core/export/model_export.cpp | : m.ffn == FfnKind::geglu && m.activation == Activation::gelu_tanh ? "extrap-safetensors/6" | : false ? "extrap-safetensors/6" | an export of geglu with GELU's tanh form is not marked format 6, so a reader of format 5 takes it as the erf form
analysis/extrap_model.py | gate = F.silu(g) if self.arch["ffn"] == "swiglu" else self.act(g) | gate = F.silu(g) if self.arch["ffn"] == "swiglu" else F.gelu(g) | Python's reader gates geglu with GELU's erf form whatever the model's activation
core/model/model.cpp | const auto h = x + out_norm(ln_attention_out, a); | const auto h = x + a; | a block with norms after its sublayers skips the attention's output norm
core/model/model.cpp | return {h, out_norm(ln_ffn_out, feed_forward(ffn_input, attention_options))}; | return {h, feed_forward(ffn_input, attention_options)}; | a block with norms after its sublayers skips the feed-forward's output norm
core/model/model.cpp | ffn_input = add_layer_norm(h, {}, ln_ffn->row_norm(), ffn_dtype).second; | (void)0; | a block with norms around its sublayers skips the feed-forward's input norm
core/model/model.cpp | const auto rows = t.transpose(1, 2).reshape({B, T, heads * Dh}).to(torch::kFloat32); | const auto rows = t.reshape({B, T, heads * Dh}).to(torch::kFloat32); | qk_norm over the projection normalises rows of the head-major layout (heads mixed with positions)
core/model/memory_estimate.cpp | : m.sublayer_norms == SublayerNorms::both ? 4  // before and after each sublayer | : m.sublayer_norms == SublayerNorms::both ? 2  // before and after each sublayer | the parameter estimate counts two norms a block where norms around the sublayers make four
core/model/config.cpp | if (config.model.sublayer_norms == m.sublayer_norms) remove_key(out, "model.sublayer_norms"); | remove_key(out, "model.sublayer_norms"); | a run with norms after its sublayers has the identity of one with them before
core/export/model_export.cpp | : format7 ? "extrap-safetensors/7" | : false ? "extrap-safetensors/7" | an export with norms after the sublayers is not marked format 7, so a reader of format 6 ignores them
analysis/extrap_model.py | x = x + (a if block.ln_attention_out is None else block.ln_attention_out(a)) | x = x + a | Python's reader skips the attention's output norm
core/hub/hf_checkpoint.cpp | plan[e + "ln_attention_out.weight"] = same(s + "post_attention_layernorm.weight"); | plan[e + "ln_attention_out.weight"] = same(s + "post_feedforward_layernorm.weight"); | an imported OLMo 2's attention output norm takes the feed-forward's weights
core/hub/hf_checkpoint.cpp | require_all(family, {{m.scale_embedding, "norms before and after | require_all(family, {{true, "norms before and after | a model with norms around its sublayers and an unscaled embedding exported to Gemma 2's class, which scales it
core/attention/attention.cpp | if (bias.softcap > 0) scores = torch::tanh(scores * (1.0 / bias.softcap)) * bias.softcap; | if (false) scores = torch::tanh(scores * (1.0 / bias.softcap)) * bias.softcap; | the reference path leaves attention scores uncapped (attention.softcap)
core/attention/efficient_attention.cpp | if (p.softcap > 0) scores.mul_(1.0 / p.softcap).tanh_().mul_(p.softcap); | if (false) scores.mul_(1.0 / p.softcap).tanh_().mul_(p.softcap); | the memory-efficient path leaves attention scores uncapped
core/attention/efficient_attention.cpp | p.softcap = bias.softcap; | p.softcap = 0; | the memory-efficient path drops the bias's softcap
core/attention/fused_cpu_attention.cpp | if (p.softcap > 0) cap_rows(rows, m, n, stride, p.softcap); | if (false) cap_rows(rows, m, n, stride, p.softcap); | the fused CPU kernel computes soft-capped scores uncapped
core/eval/attention_profile.cpp | if (softcap > 0 && hi > lo) softcap_scores( | if (false) softcap_scores( | the attention profile's own kernel weighs soft-capped scores uncapped
core/model/model.cpp | bias.softcap = extras.softcap; | bias.softcap = 0; | a model's attention.softcap never reaches its attention
core/model/model.cpp | const double factor = std::sqrt(double(options.d_head()) / s); | const double factor = std::sqrt(s / double(options.d_head())); | attention.scale_dim inverted: scores q.k sqrt(s) / d_head
core/model/model.cpp | return c > 0 ? torch::tanh(l * (1.0 / c)) * c : l; | return l; | model.logit_softcap ignored: the logits uncapped
core/hub/hf_checkpoint.cpp | if (const double a = cap("attn_logit_softcapping", kin.caps.scores); a > 0) | if (const double a = cap("attn_logit_softcapping", kin.caps.scores); a > 1e9) | an imported Gemma 2's attention scores left uncapped
core/hub/hf_checkpoint.cpp | if (scalar != double(head_dim)) hf.attention["scale_dim"] = scalar; | (void)scalar; | an imported Gemma 2's query_pre_attn_scalar ignored (scores over sqrt(d_head))
core/hub/hf_checkpoint.cpp | for (int64_t l = 0; l < layers; l += 2) sliding[size_t(l)] = true; | for (int64_t l = 1; l < layers; l += 2) sliding[size_t(l)] = true; | a Gemma 2 config without layer_types windows the odd layers (Gemma2Config: the even ones)
core/hub/hf_checkpoint.cpp | plan[e + "ln_ffn.weight"] = norm(s + "pre_feedforward_layernorm.weight"); | plan[e + "ln_ffn.weight"] = norm(s + "post_feedforward_layernorm.weight"); | an imported Gemma 2's norm before the MLP takes the one after it
core/hub/hf_checkpoint.cpp | c["query_pre_attn_scalar"] = a.scale_dim > 0 ? int64_t(a.scale_dim) : m.d_head(); | c["query_pre_attn_scalar"] = m.d_head(); | a Gemma 2 export's query_pre_attn_scalar is the heads' width, not attention.scale_dim
core/hub/hf_checkpoint.cpp | : capped && windows ? "soft-capped attention scores or logits, or a score scale of their " | : false ? "soft-capped attention scores or logits, or a score scale of their " | a soft-capped model outside Llama's kin named for its attention options, not its caps
analysis/extrap_model.py | scores = torch.tanh(scores / cap) * cap | scores = scores + 0 * cap | Python's reader leaves attention scores uncapped
core/export/model_export.cpp | : format8 ? "extrap-safetensors/8" | : false ? "extrap-safetensors/8" | an export with soft-capped scores or logits is not marked format 8, so a reader of format 7 ignores them
core/hub/hf_checkpoint.cpp | for (int64_t l = 0; l < layers; ++l) sliding[size_t(l)] = (l + 1) % period != 0; | for (int64_t l = 0; l < layers; ++l) sliding[size_t(l)] = l % period != 0; | a Gemma 3 config without layer_types makes the first layer of each period global, not the last
core/hub/hf_checkpoint.cpp | if (key) theta = c.get<double>(key, theta); | if (key) theta = c.get<double>("rope_theta", theta); | an older Gemma 3 config's local layers rotate with the global layers' base
core/hub/hf_checkpoint.cpp | kinds["full_attention"].update(scaling); | (void)scaling; | an older Gemma 3 config's rope_scaling dropped from its global layers
core/hub/hf_checkpoint.cpp | if (hf.layers.size() > 0) hf.layers["kinds"]["sliding"]["position"] = sliding_rope; | if (false) hf.layers["kinds"]["sliding"]["position"] = sliding_rope; | an imported Gemma 3's local layers rotate with the global layers' RoPE
core/hub/hf_checkpoint.cpp | c["rope_parameters"] = {{"full_attention", rope_json(global_rope, config)}, | c["rope_parameters"] = {{"full_attention", rope_json(local_rope, config)}, | a Gemma 3 export gives its global layers the local layers' RoPE
core/hub/hf_checkpoint.cpp | if (kin.caps.scores_dropped && c.has("attn_logit_softcapping")) | if (false) | a Gemma 3 config that caps the scores imported capped, where transformers' class caps none
core/hub/hf_checkpoint.cpp | {a.softcap > 0, {"gemma2"}, | {a.softcap > 0, {"gemma2", "gemma3_text"}, | a Gemma 3 export with soft-capped scores, which its class computes uncapped
core/hub/hf_checkpoint.cpp | for (int64_t l = 0; l < layers; ++l) sliding[size_t(l)] = (l + 1) % 4 != 0; | for (int64_t l = 0; l < layers; ++l) sliding[size_t(l)] = l % 4 != 0; | an OLMo 3 config without layer_types makes the first layer of each four global, not the last
core/hub/hf_checkpoint.cpp | else if (const double top = c.get<double>("rope_theta", theta); top != theta) | else if (const double top = theta; top != theta) | an OLMo 3 config whose top-level rope_theta transformers gives to its global layers alone imported as if it were
core/hub/hf_checkpoint.cpp | olmo3.kind_ropes = {true, 5e5, nullptr, 5e5}; | olmo3.kind_ropes = {true, 5e5, nullptr, 1e4}; | an OLMo 3 config without its local layers' base rotates them with Gemma 3's 1e4, not Olmo3Config's 5e5
core/hub/hf_checkpoint.cpp | out.family = olmo     ? (window > 0 | out.family = olmo     ? (false | an OLMo model with a window on every layer exported to OLMo 2's class, which has none
core/hub/hf_checkpoint.cpp | family == "olmo3") { | family == "olmo9") { | an OLMo 3 export without its layer_types and window: transformers' default pattern and width instead
core/hub/hf_checkpoint.cpp | family == "olmo3"; | family == "olmo9"; | an OLMo 3 export with one RoPE for every layer, its local layers' own dropped
core/hub/hf_checkpoint.cpp | {!every_layer, {"qwen2", "qwen3", "gemma2", "gemma3_text", "olmo3"}, | {!every_layer, {"qwen2", "qwen3", "gemma2", "gemma3_text"}, | an OLMo model with windows on some layers refused by OLMo 3's class, which has them
core/hub/hf_checkpoint.cpp | o.families.count(family)) continue; | o.families.count(family) + o.families.empty()) continue; | options no class of Llama's kin computes (an interleaved rotary, biases) exported as if the class did
core/run/import_run.cpp | if (length > TrainConfig().batch_tokens) root["train"]["batch_tokens"] = length; | if (false) root["train"]["batch_tokens"] = length; | importing a model trained past 8192 positions (Llama 3.1, Gemma 3) refused on train.batch_tokens
core/hub/hf_checkpoint.cpp | if (!text.contains(key)) text[key] = value; | if (false) text[key] = value; | a multimodal Gemma 3 config without Gemma3TextConfig's defaults for the keys the Hub leaves out
core/hub/hf_checkpoint.cpp | {"vision_tower.", "multi_modal_projector."}}, | {"vision_tower.", nullptr}}, | Gemma 3's multimodal projector taken for a tensor of another model
core/hub/hf_checkpoint.cpp | "embed_tokens.weight", "model.language_model.", | "embed_tokens.weight", "", | multimodal Gemma 3 weights under transformers' module names (model.language_model) not found
core/hub/hf_checkpoint.cpp | name.rfind(std::string("model.") + part, 0) == 0 | false | a multimodal Gemma 3's vision tower under model. taken for a tensor of another model
core/hub/hf_checkpoint.cpp | if (t.has("final_logit_softcapping")) | if (false) | a multimodal Gemma 3 config capping the logits imported capped, where transformers' class caps none
core/hub/hf_checkpoint.cpp | if (!r->get<bool>("tie_word_embeddings", true)) | if (false) | a multimodal Gemma 3 with an untied head imported tied
core/hub/hf_checkpoint.cpp | phi3.layout = LlamaLayout::fused; | phi3.layout = LlamaLayout::separate; | Phi-3's fused q, k, v and gate, up tensors looked for apart
core/attention/fused_cpu_attention.cpp | if (p.softcap > 0) cap_backward_rows(dscores.data(), raw.data(), m, n, ns, p.softcap);  // dS of the uncapped scores | if (false) cap_backward_rows(dscores.data(), raw.data(), m, n, ns, p.softcap); | the fused CPU backward leaves the soft cap's gradient out (float32 products)
core/attention/fused_cpu_attention.cpp | if (p.softcap > 0) cap_backward_rows(dscores.data(), raw.data(), m, n, ns, p.softcap);  // as backward_kernel | if (false) cap_backward_rows(dscores.data(), raw.data(), m, n, ns, p.softcap); | the fused CPU backward leaves the soft cap's gradient out (bfloat16 products)
core/attention/fused_cpu_attention.cpp | g[j] *= 1.0f - t * t; | g[j] *= 1.0f - t; | the soft cap's gradient taken as 1 - tanh, not 1 - tanh^2
core/attention/fused_cpu_attention.cpp | p.softcap = float(ctx->saved_data["softcap"].toDouble()); | p.softcap = 0; | the fused backward recomputes the probabilities without the soft cap
core/kernels/cpu_vector_math.h | const float t = a < 0.5f ? a * poly : far; | const float t = a < 0.5f ? a : far; | tanh_float takes tanh x as x below 0.5 (its series dropped)
core/model/config.cpp | if (!off_or_normal_float32(a.softcap)) r.fail | if (false) r.fail | an attention.softcap float32 holds as 0 or infinity is accepted (the cap dropped, or NaN scores)
core/model/model.cpp | if (options.clip_qkv() > 0) projection = projection.clamp(-options.clip_qkv(), options.clip_qkv()); | if (false) projection = projection.clamp(-options.clip_qkv(), options.clip_qkv()); | model.clip_qkv read and never applied: q, k and v unclipped
core/model/norm.cpp |   if (!options.affine()) return; |   if (false) return; | norms without parameters (model.norm_affine false) built with a weight and bias all the same
core/kernels/residual_norm.cpp | norm.weight : torch::ones({x.size(-1)}, x.options()); | norm.weight : torch::full({x.size(-1)}, 2.0, x.options()); | the fused residual norm's stand-in weight for a norm without parameters is not ones
core/hub/hf_checkpoint.cpp |     hf.model["norm_affine"] = false; |     hf.model["norm_affine"] = true; | OLMo's LayerNorms without parameters imported with weights the folder lacks
core/hub/hf_checkpoint.cpp |   if (clip == 0 && zero_is_off) return; |   if (clip == 0) return; | OLMo's clip_qkv 0 (its class clamps every value to 0) imported as off
core/hub/hf_checkpoint.cpp |   if (a.contains("clip_qkv")) read_clip_qkv( |   if (false) read_clip_qkv( | MPT's attn_config.clip_qkv ignored on import
core/hub/hf_checkpoint.cpp |     c.update({{"attention_bias", false}, {"clip_qkv", m.clip_qkv > 0 ? json(m.clip_qkv) : json(nullptr)}, |     c.update({{"attention_bias", false}, {"clip_qkv", json(nullptr)}, | OLMo's export drops the clip from config.json
analysis/extrap_model.py |                 qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv) |                 qkv = qkv | Python's reader (and the remote code) ignores clip_qkv
core/model/memory_estimate.cpp |   const int64_t each = m.norm_affine ? (m.norm_biased() ? 2 : 1) : 0; |   const int64_t each = m.norm_biased() ? 2 : 1; | the parameter estimate counts weights for norms without parameters
core/model/config.cpp |     if (!m.norm_affine && m.norm_bias.value_or(false)) |     if (false) | model.norm_bias true beside norm_affine false accepted and silently dropped
core/export/model_export.cpp |   if (!m.norm_affine) out["norm_affine"] = false; |   if (false) out["norm_affine"] = false; | the export's metadata omits norm_affine false: readers expect weights the file lacks
core/hub/hf_checkpoint.cpp |   require_classes(out.family, {{!m.norm_affine, {"olmo"} |   require_classes(out.family, {{false, {"olmo"} | a model with norms without parameters exported to a class that builds weighted norms
core/export/model_export.cpp | metadata["format"] = format9   ? "extrap-safetensors/9" | metadata["format"] = false   ? "extrap-safetensors/9" | an export with norms without parameters or clipped q, k, v not marked format 9
EOF
)

mapfile -t LINES <<<"$MUTATIONS"
if [[ ${1:-} == --texts ]]; then
  bad=0
  for n in "${!LINES[@]}"; do
    # Four fields: a '|' inside a text (C++'s ||) would cut it and test another edit.
    IFS='|' read -r -a fields <<<"${LINES[$n]}"
    if ((${#fields[@]} != 4)); then
      echo "mutation $((n + 1)): ${#fields[@]} fields, not 4 (a '|' inside a text?): ${LINES[$n]}"
      bad=1
      continue
    fi
    IFS='|' read -r file before after what <<<"${LINES[$n]}"
    file=$(echo "$file" | xargs); before=$(echo "$before" | sed 's/^ //; s/ $//')
    count=$(BEFORE="$before" "$PYTHON" -c 'import os, sys; print(open(sys.argv[1]).read().count(os.environ["BEFORE"]))' "$ROOT/$file")
    if [[ $count != 1 ]]; then
      echo "mutation $((n + 1)): $file holds its text $count times (expected once): $before"
      bad=1
    fi
  done
  ((bad == 0)) && echo "${#LINES[@]} mutation texts each occur once"
  exit $bad
fi
selected=("$@")
results=()
missed=0
restore() {
  if [[ -n ${BACKUP:-} && -f $BACKUP ]]; then
    cp "$BACKUP" "$TARGET"
    rm -f "$BACKUP"
  fi
}
trap 'restore; exit 130' INT TERM
build() { cmake --build build -j"$(nproc)" --target extrap_tests extrap_cli extrap_local_window >/tmp/extrap-mutation-build.log 2>&1; }

for n in "${!LINES[@]}"; do
  number=$((n + 1))
  if ((${#selected[@]})) && [[ ! " ${selected[*]} " =~ " $number " ]]; then continue; fi
  IFS='|' read -r file before after what <<<"${LINES[$n]}"
  file=$(echo "$file" | xargs); what=$(echo "$what" | sed 's/^ *//; s/ *$//')
  before=$(echo "$before" | sed 's/^ //; s/ $//'); after=$(echo "$after" | sed 's/^ //; s/ $//')
  TARGET=$ROOT/$file
  BACKUP=$(mktemp)
  cp "$TARGET" "$BACKUP"
  if ! "$PYTHON" - "$TARGET" "$before" "$after" <<'PY'
import sys
path, before, after = sys.argv[1:4]
text = open(path).read()
if text.count(before) != 1:
    sys.exit("%s: the mutation's text occurs %d times (expected once): %s" % (path, text.count(before), before))
open(path, "w").write(text.replace(before, after))
PY
  then
    restore
    results+=("$number. $what ($file): NOT APPLIED")
    missed=$((missed + 1))
    continue
  fi
  echo "== $number. $what ($file)"
  if ! build; then
    caught="does not compile"
  else
    # Not mutation_check.texts: it fails on every mutated line by design, and would "catch" all.
    (cd build && ctest -j"$(nproc)" --timeout 600 --stop-on-failure -E '^mutation_check[.]texts$' \
       >/tmp/extrap-mutation-ctest.log 2>&1)
    if [[ $? -eq 0 ]]; then
      caught=""
    else
      caught=$(sed -n 's/^[0-9]*:\(.*\)$/\1/p' build/Testing/Temporary/LastTestsFailed.log | head -3 | paste -sd ';' -)
      [[ -n $caught ]] || caught="(ctest failed: see /tmp/extrap-mutation-ctest.log)"
    fi
  fi
  restore
  if [[ -z $caught ]]; then
    results+=("$number. $what ($file): MISSED")
    missed=$((missed + 1))
  else
    results+=("$number. $what ($file): caught by $caught")
  fi
  echo "   ${caught:-MISSED}"
done
echo "restoring the build"
build || echo "rebuild failed: see /tmp/extrap-mutation-build.log"
echo
printf '%s\n' "${results[@]}"
echo "$missed missed of ${#results[@]}"
((missed == 0))
