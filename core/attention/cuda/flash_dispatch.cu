// The one dispatch point of the fused attention kernels: checks a call's parameters, then
// picks the compiled configuration (input type x head dimension x bias mode) from the list
// in flash_launch.cuh. Every entry of that list is instantiated by flash_fwd.cu and
// flash_bwd.cu, so nothing is dispatched that was not compiled.
#include "core/attention/cuda/flash_dispatch.h"

#include "core/attention/cuda/alibi.cuh"
#include "core/attention/cuda/flash_launch.cuh"

#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace extrap::cuda {
namespace {

const char* name_of(BiasMode mode) {
  switch (mode) {
    case BiasMode::None: return "none";
    case BiasMode::AlibiCausal: return "alibi-causal";
    case BiasMode::AlibiSymmetric: return "alibi-symmetric";
    case BiasMode::AlibiNonsymmetric: return "alibi-nonsymmetric";
    case BiasMode::Linear: return "linear";
    case BiasMode::Offsets: return "offsets";
  }
  return "?";
}

void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument("flash attention: " + message);
}

// 16-byte vectors: aligned base pointer, strides that keep every row aligned.
void require_vector_view(const TensorView& view, const char* name) {
  require(view.data != nullptr, std::string(name) + " is null");
  require(reinterpret_cast<std::uintptr_t>(view.data) % 16 == 0,
          std::string(name) + " is not 16-byte aligned");
  require(view.batch_stride % 8 == 0 && view.head_stride % 8 == 0 && view.row_stride % 8 == 0,
          std::string(name) + " strides must be multiples of 8 elements, got " +
              std::to_string(view.batch_stride) + ", " + std::to_string(view.head_stride) + ", " +
              std::to_string(view.row_stride));
}

void validate(const FlashFwdParams& p) {
  require(flash_supports(p.dtype, p.head_dim),
          "head dimension " + std::to_string(p.head_dim) + " is not compiled (64 or 128)");
  require(p.batch >= 1 && p.batch <= 65535, "batch must be in [1, 65535], got " + std::to_string(p.batch));
  require(p.heads >= 1 && p.heads <= 65535, "heads must be in [1, 65535], got " + std::to_string(p.heads));
  require(p.seq_len >= 1 && p.seq_len <= (1 << 24),
          "sequence length must be in [1, 2^24], got " + std::to_string(p.seq_len));
  require_vector_view(p.q, "q");
  require_vector_view(p.k, "k");
  require_vector_view(p.v, "v");
  require_vector_view(p.o, "o");
  require(p.lse != nullptr, "lse is null");
  const FlashBias& b = p.bias;
  if (b.mode == BiasMode::Linear) {
    require(b.slopes_left != nullptr && b.slopes_right != nullptr, "linear bias needs both slope arrays");
    require(p.heads <= kMaxLinearHeads, "linear bias supports at most " +
                                            std::to_string(kMaxLinearHeads) + " heads, got " +
                                            std::to_string(p.heads));
  }
  if (b.mode == BiasMode::Offsets) {
    // Every offset a visible score reaches: -(T - 1) .. 0, and 1 .. T - 1 unless causal.
    require(b.offsets != nullptr, "offsets bias needs its table");
    require(b.offsets_origin >= p.seq_len - 1 && b.offsets_len - 1 - b.offsets_origin >= (p.causal ? 0 : p.seq_len - 1),
            "offsets table of " + std::to_string(b.offsets_len) + " entries with offset 0 at " +
                std::to_string(b.offsets_origin) + " does not cover the offsets of length " + std::to_string(p.seq_len));
  }
  if (b.mode == BiasMode::AlibiNonsymmetric)
    require(p.heads % 2 == 0, "nonsymmetric ALiBi needs an even number of heads, got " +
                                  std::to_string(p.heads));
  if (b.mode == BiasMode::AlibiSymmetric || b.mode == BiasMode::AlibiNonsymmetric)
    require((b.slopes_left == nullptr) == (b.slopes_right == nullptr),
            std::string(name_of(b.mode)) + ": give both slope arrays or neither");
}

// A setting of the environment variable `name`: unset, empty or `word` (if not null) ->
// `fallback`, else one of `allowed` (its decimal text); anything else is refused, naming the
// variable.
int environment_setting(const char* name, const char* word, int fallback, std::initializer_list<int> allowed) {
  const char* text = std::getenv(name);
  const std::string value = text == nullptr ? "" : text;
  if (value.empty() || (word != nullptr && value == word)) return fallback;
  std::string choices = word != nullptr ? word : "";
  for (const int choice : allowed) {
    if (value == std::to_string(choice)) return choice;
    choices += (choices.empty() ? "" : ", ") + std::to_string(choice);
  }
  throw std::invalid_argument(std::string("flash attention: ") + name + " must be one of " + choices + ", got '" +
                              value + "'");
}

// EXTRAP_FLASH_FWD_ROWS: auto (0: chosen per call), 64 or 128.
int fwd_rows_setting() { return environment_setting("EXTRAP_FLASH_FWD_ROWS", "auto", 0, {64, 128}); }

// EXTRAP_FLASH_BWD_ATOMICS: 1, 2 or 4 (the default).
int bwd_atomics_setting() { return environment_setting("EXTRAP_FLASH_BWD_ATOMICS", nullptr, 4, {1, 2, 4}); }

// Whether every head sees only one side of the diagonal, so that a block of queries does
// triangular work (causal, or ALiBi's causal and nonsymmetric modes).
bool triangular(const FlashFwdParams& p) {
  return p.causal || p.bias.mode == BiasMode::AlibiCausal || p.bias.mode == BiasMode::AlibiNonsymmetric;
}

template <BiasMode kMode>
__global__ void geometric_slopes_kernel(int heads, float* left, float* right) {
  const int head = blockIdx.x * blockDim.x + threadIdx.x;
  if (head >= heads) return;
  const HeadSlopes hs = head_slopes<kMode>(FlashBias{}, head, heads);
  left[head] = hs.look_left ? hs.left : 0.f;
  right[head] = hs.look_right ? hs.right : 0.f;
}

}  // namespace

bool flash_supports(ElementType dtype, int head_dim) {
#define EXTRAP_SUPPORTS(Element, HeadDim, Mode) \
  if (dtype == element_type_of<Element>() && head_dim == HeadDim) return true;
  EXTRAP_FLASH_CONFIGS(EXTRAP_SUPPORTS)
#undef EXTRAP_SUPPORTS
  return false;
}

int flash_fwd_block_rows(const FlashFwdParams& params) {
  static const int setting = fwd_rows_setting();
  if (setting != 0) return setting;
  // Measured (NOTES.md, H200, 2026-11-26): 128 rows are 4-12% faster without a causal
  // triangle, and level or up to 7% slower with one.
  return triangular(params) ? 64 : 128;
}

std::string flash_fwd_rows_setting() {
  static const int setting = fwd_rows_setting();
  return setting == 0 ? "auto" : std::to_string(setting);
}

int flash_bwd_atomic_width() {
  static const int width = bwd_atomics_setting();
  return width;
}

void flash_attention_forward(const FlashFwdParams& params, cudaStream_t stream) {
  validate(params);
  const int m_frags = flash_fwd_block_rows(params) / 64;
#define EXTRAP_DISPATCH_FWD(Element, HeadDim, Mode)                                  \
  if (params.dtype == element_type_of<Element>() && params.head_dim == HeadDim && \
      params.bias.mode == Mode)                                                    \
    return m_frags == 2 ? launch_flash_fwd<Element, HeadDim, Mode, 2>(params, stream)  \
                        : launch_flash_fwd<Element, HeadDim, Mode, 1>(params, stream);
  EXTRAP_FLASH_CONFIGS(EXTRAP_DISPATCH_FWD)
#undef EXTRAP_DISPATCH_FWD
  throw std::invalid_argument(std::string("flash attention forward: bias mode ") +
                              name_of(params.bias.mode) + " is not compiled");
}

void flash_attention_backward(const FlashBwdParams& call, cudaStream_t stream) {
  FlashBwdParams params = call;
  params.dq_atomic_width = flash_bwd_atomic_width();
  const FlashFwdParams& f = params.fwd;
  validate(f);
  require_vector_view(params.dout, "dout");
  require_vector_view(params.dq, "dq");
  require_vector_view(params.dk, "dk");
  require_vector_view(params.dv, "dv");
  require(params.delta != nullptr && params.dq_accum != nullptr, "backward workspaces are null");
  require(reinterpret_cast<std::uintptr_t>(params.dq_accum) % 16 == 0, "dq_accum is not 16-byte aligned");
  require((params.dslopes_left == nullptr) == (params.dslopes_right == nullptr),
          "give both slope-gradient arrays or neither");
#define EXTRAP_DISPATCH_BWD(Element, HeadDim, Mode)                          \
  if (f.dtype == element_type_of<Element>() && f.head_dim == HeadDim && \
      f.bias.mode == Mode)                                               \
    return launch_flash_bwd<Element, HeadDim, Mode>(params, stream);
  EXTRAP_FLASH_CONFIGS(EXTRAP_DISPATCH_BWD)
#undef EXTRAP_DISPATCH_BWD
  throw std::invalid_argument(std::string("flash attention backward: bias mode ") +
                              name_of(f.bias.mode) + " is not compiled");
}

int64_t flash_bwd_delta_floats(int batch, int heads, int seq_len) {
  return static_cast<int64_t>(batch) * heads * seq_len;
}

int64_t flash_bwd_dq_accum_floats(int batch, int heads, int seq_len, int head_dim) {
  return static_cast<int64_t>(batch) * heads * seq_len * head_dim;
}

void flash_geometric_slopes(BiasMode mode, int heads, float* left, float* right,
                            cudaStream_t stream) {
  require(heads >= 1, "heads must be positive, got " + std::to_string(heads));
  require(mode != BiasMode::AlibiNonsymmetric || heads % 2 == 0,
          "nonsymmetric ALiBi needs an even number of heads, got " + std::to_string(heads));
  const unsigned blocks = static_cast<unsigned>((heads + 127) / 128);
  switch (mode) {
    case BiasMode::AlibiCausal:
      geometric_slopes_kernel<BiasMode::AlibiCausal><<<blocks, 128, 0, stream>>>(heads, left, right);
      break;
    case BiasMode::AlibiSymmetric:
      geometric_slopes_kernel<BiasMode::AlibiSymmetric><<<blocks, 128, 0, stream>>>(heads, left, right);
      break;
    case BiasMode::AlibiNonsymmetric:
      geometric_slopes_kernel<BiasMode::AlibiNonsymmetric><<<blocks, 128, 0, stream>>>(heads, left, right);
      break;
    default:
      throw std::invalid_argument(std::string("flash attention: ") + name_of(mode) +
                                  " has no geometric slopes");
  }
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("flash attention slopes: ") + cudaGetErrorString(status));
}

}  // namespace extrap::cuda
