#include "log.h"

#include <cstdio>
#include <mutex>
#include <set>
#include <utility>

namespace cc1d {
namespace {

struct LogState {
  std::mutex mu;
  LogHandler handler;
  std::set<std::string> seen;
};

LogState& state() {
  static LogState s;
  return s;
}

void default_handler(const std::string& m) {
  std::fprintf(stderr, "cc1d: %s\n", m.c_str());
}

}  // namespace

void set_log_handler(LogHandler handler) {
  LogHandler old;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    old = std::exchange(state().handler, std::move(handler));
  }
  // `old` dies here, outside the lock (a Python callable needs the GIL to die).
}

void warn(const std::string& message) {
  LogHandler h;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    h = state().handler;
  }
  // Called outside the lock: a handler may log again or take other locks.
  if (h) h(message); else default_handler(message);
}

void warn_once(const std::string& key, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(state().mu);
    if (!state().seen.insert(key).second) return;
  }
  warn(message);
}

}  // namespace cc1d
