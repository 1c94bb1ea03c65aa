#include "core/attention/cuda_attention.h"

#include "core/base/late_registration.h"

namespace extrap {

namespace {

LateRegistration<CudaAttention> registered_attention;

}  // namespace

void register_cuda_attention(const CudaAttention& entry) { registered_attention.set(entry); }

const CudaAttention* cuda_attention() { return registered_attention.get(); }

}  // namespace extrap
