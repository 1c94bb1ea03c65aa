// A piece of work whose failure is a result to record (an evaluation at one length, a LongPPL
// score), not the end of the job.
#pragma once

#include "core/runtime/distributed.h"

#include <exception>
#include <string>

namespace extrap {

// Runs `work`: "" when it succeeds, else the one-line message of what it threw. A
// DistributedError, after which the job cannot go on, propagates.
template <class Work>
std::string failure_of(Work&& work) {
  try {
    work();
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& error) {
    return failure_message(error);
  }
  return "";
}

}  // namespace extrap
