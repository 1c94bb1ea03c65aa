// Deterministic fault injection, for the tests only: they kill a process at exact moments
// (after a checkpoint, after a results point, between writing a file and publishing it)
// instead of guessing them from the clock.
//
//   EXTRAP_TEST_STOP_AT="MOMENT[@TEXT]:N[,...]"   e.g. "checkpoint:3" or "publish@tiny.h5:1"
//   EXTRAP_TEST_STOP_FILE=PATH
//
// The Nth time a process passes MOMENT (with TEXT in the moment's detail, when given) it appends "PID MOMENT N DETAIL" to PATH (durably) and
// stops itself with SIGSTOP; the test reads the line, then sends SIGKILL. Counts are per
// process (a sweep's worker processes count their own). Without the variables a call costs
// one branch.
#pragma once

#include <string>

namespace extrap {

// The moments: "checkpoint" (a checkpoint is complete on disk; detail: run directory and
// step), "step" (an optimiser step is done; detail: run directory, step and rank), "point" (a sweep point is in its results file; detail: run, mode and length),
// "publish" (a file's new contents are durable under its temporary name, not yet renamed;
// detail: the file).
void fault_point(const char* moment, const std::string& detail);

}  // namespace extrap
