// The default kernel catalog: every variant the runtime can launch without a
// tuning DB. Its definition is generated at build time by
// `python3 -m generator.catalog --out <file.cpp>`: entries grouped by family,
// the preferred variant of a family first, a fully general one
// (align_bytes = element size) last.
#pragma once
#include <cstddef>

namespace cc1d::catalog {

struct Entry {
  const char* family;  // fwd.cl.bf16wf32.w4
  const char* key;     // readable variant key
  const char* hash;    // sha256 hex of source
  const char* source;  // complete translation unit, entry point cc1d_kernel
  int threads, tile_l, tile_d, smem_bytes, align_bytes, split_blocks;
};

const Entry* entries();
std::size_t num_entries();
// generator/space.py EPOCH when the catalog was rendered; tuning-DB entries of
// another epoch are ignored.
int generator_epoch();

}  // namespace cc1d::catalog
