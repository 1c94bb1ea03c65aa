#include "core/runtime/progress.h"

#include "core/runtime/sysinfo.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>

namespace extrap {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  char buffer[32];
  const int64_t s = int64_t(seconds + 0.5);
  if (s >= 3600)
    std::snprintf(buffer, sizeof buffer, "%" PRId64 "h%02dm", s / 3600, int(s / 60 % 60));
  else
    std::snprintf(buffer, sizeof buffer, "%dm%02ds", int(s / 60), int(s % 60));
  return buffer;
}

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
size_t terminal_width() {
  winsize size{};
  if (ioctl(fileno(stderr), TIOCGWINSZ, &size) == 0 && size.ws_col > 20) return size.ws_col;
  return 120;
}
}  // namespace

StatusLine::StatusLine(bool redraw) : redraw_(redraw && stderr_is_terminal()) {}

void StatusLine::status(const std::string& text, bool force) {
  if (!redraw_) return;
  const double t = now();
  if (!force && last_draw_ >= 0 && t - last_draw_ < 0.2) return;
  last_draw_ = t;
  std::string shown = text;
  const size_t width = terminal_width();
  if (shown.size() >= width) shown.resize(width - 1);
  std::fprintf(stderr, "\r\033[K%s", shown.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void StatusLine::line(const std::string& text) {
  if (redraw_) std::fputs("\r\033[K", stderr);  // whoever drew the status line
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
  drawn_ = false;
  last_draw_ = -1;
}

void StatusLine::clear() {
  if (redraw_ && drawn_) {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }
  drawn_ = false;
  last_draw_ = -1;
}

void StatusLine::finish() {
  if (redraw_ && drawn_) std::fputc('\n', stderr);
  drawn_ = false;
}

}  // namespace extrap
