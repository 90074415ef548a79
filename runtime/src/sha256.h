// SHA-256 (FIPS 180-4), our own so the runtime has no crypto dependency.
// Used for content hashes: kernel sources, compile-cache keys, cache files.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace cc1d {

class Sha256 {
 public:
  Sha256();
  Sha256& update(const void* data, std::size_t size);
  Sha256& update(const std::string& s) { return update(s.data(), s.size()); }
  std::array<uint8_t, 32> digest();   // finishes; the object must not be updated after
  std::string hex_digest();

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  std::size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(const void* data, std::size_t size);
inline std::string sha256_hex(const std::string& s) { return sha256_hex(s.data(), s.size()); }

}  // namespace cc1d
