// Progress output on stderr, shared by the trainer and sweeps: on a terminal one status line
// redrawn in place (at most five times a second) with permanent lines printed above it;
// elsewhere (a log file, a worker process) plain lines only.
#pragma once

#include <string>

namespace extrap {

// "3m05s", "2h14m"; "?" when not finite or negative.
std::string format_duration(double seconds);

class StatusLine {
 public:
  // `redraw`: draw the status line in place (only when stderr is a terminal).
  explicit StatusLine(bool redraw);
  bool redraws() const { return redraw_; }
  // Redraws the status line (a terminal only; throttled unless `force`).
  void status(const std::string& text, bool force = false);
  // A permanent line (above the status line on a terminal).
  void line(const std::string& text);
  // Ends the status line (a terminal only): what was drawn stays.
  void finish();
  // Erases the status line (a terminal only), for output that takes its place.
  void clear();

 private:
  bool redraw_;
  bool drawn_ = false;
  double last_draw_ = -1;
};

}  // namespace extrap
