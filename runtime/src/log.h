// Warnings from the runtime go through one replaceable handler (default:
// stderr with a "cc1d: " prefix); the Python module routes them to `logging`.
#pragma once
#include <functional>
#include <string>

namespace cc1d {

using LogHandler = std::function<void(const std::string&)>;

// Replaces the handler; an empty function restores the default.
void set_log_handler(LogHandler handler);

void warn(const std::string& message);
// Warns the first time `key` is seen in this process; later calls are silent.
void warn_once(const std::string& key, const std::string& message);

}  // namespace cc1d
