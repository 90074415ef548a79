// Compiled binaries by content: key = sha256(source, options, compiler
// version, target). Kept in memory for the process and on disk across
// processes (<cache_dir>/kernels/<target>/<key>.bin, written atomically).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend.h"

namespace cc1d {

// Compiles at most once per key in this process, even when many threads ask
// at once; concurrent processes may both compile, and the last rename wins
// with identical content. Throws what the backend throws (failures are not cached).
CompileResult compile_cached(Backend& backend, const std::string& source, const std::string& target,
                             const std::vector<std::string>& options);

// Compilations run by this process (compiler invocations, not cache hits) and
// disk-cache files found corrupt and rebuilt: dispatch_stats() reports them.
uint64_t compile_count();
uint64_t corrupt_cache_files();

// The cache key (hex) of a compilation; exposed for tests and tools.
std::string compile_key(const std::string& source, const std::string& target,
                        const std::vector<std::string>& options, const std::string& compiler_version);

}  // namespace cc1d
