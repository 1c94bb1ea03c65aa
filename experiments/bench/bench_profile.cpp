#include "experiments/bench/bench_profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace extrap::bench {

namespace {

std::string shapes_text(const torch::autograd::profiler::KinetoEvent& event) {
  if (!event.hasShapes()) return "";
  std::ostringstream out;
  bool first = true;
  for (const auto& shape : event.shapes()) {
    if (shape.empty()) continue;
    out << (first ? "" : " ") << "[";
    for (size_t i = 0; i < shape.size(); ++i) out << (i ? "," : "") << shape[i];
    out << "]";
    first = false;
  }
  return out.str();
}

}  // namespace

void print_operator_profile(const std::function<void()>& step, int64_t steps, int top) {
  namespace prof = torch::autograd::profiler;
  namespace impl = torch::profiler::impl;
  prof::prepareProfiler(impl::ProfilerConfig(impl::ProfilerState::KINETO, /*report_input_shapes=*/true),
                        {impl::ActivityType::CPU});
  prof::enableProfiler(impl::ProfilerConfig(impl::ProfilerState::KINETO, true), {impl::ActivityType::CPU});
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) step();
  const double wall_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  const auto result = prof::disableProfiler();

  // Self time: per thread, events nest as intervals; a parent's self time is its duration less
  // its direct children's.
  struct Span {
    uint64_t start, end;
    std::string key;
    double self;
  };
  std::map<uint64_t, std::vector<Span>> by_thread;
  for (const auto& e : result->events()) {
    if (e.isAsync() || e.durationNs() == 0) continue;
    by_thread[e.startThreadId()].push_back({e.startNs(), e.endNs(), e.name() + "  " + shapes_text(e),
                                            double(e.durationNs())});
  }
  struct Group {
    double self_ns = 0;
    int64_t calls = 0;
  };
  std::map<std::string, Group> groups, by_name;
  double total_ns = 0;
  for (auto& [thread, spans] : by_thread) {
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.start != b.start ? a.start < b.start : a.end > b.end;
    });
    std::vector<Span*> open;
    for (auto& s : spans) {
      while (!open.empty() && open.back()->end <= s.start) open.pop_back();
      if (!open.empty()) open.back()->self -= double(s.end - s.start);
      open.push_back(&s);
    }
    for (const auto& s : spans) {
      for (auto* g : {&groups[s.key], &by_name[s.key.substr(0, s.key.find("  "))]}) {
        g->self_ns += s.self;
        g->calls += 1;
      }
      total_ns += s.self;
    }
  }
  auto heaviest = [](const std::map<std::string, Group>& m) {
    std::vector<std::pair<std::string, Group>> sorted(m.begin(), m.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const auto& a, const auto& b) { return a.second.self_ns > b.second.self_ns; });
    return sorted;
  };
  std::printf("\noperator profile: %lld steps, %.1f ms a step (profiled, wall), operators' self time "
              "%.1f ms a step (all threads that ran operators)\n",
              (long long)steps, wall_ns / 1e6 / double(steps), total_ns / 1e6 / double(steps));
  auto print = [&](const std::map<std::string, Group>& m, const char* heading) {
    std::printf("%9s %6s %7s  %s\n", "ms/step", "%", "calls", heading);
    const auto sorted = heaviest(m);
    for (int i = 0; i < top && i < int(sorted.size()); ++i) {
      const auto& [key, g] = sorted[size_t(i)];
      std::printf("%9.2f %6.1f %7.1f  %s\n", g.self_ns / 1e6 / double(steps), 100.0 * g.self_ns / total_ns,
                  double(g.calls) / double(steps), key.c_str());
    }
  };
  print(by_name, "operator");
  std::printf("\n");
  print(groups, "operator  input shapes");
}

}  // namespace extrap::bench
