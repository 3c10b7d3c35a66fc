// SPDX-License-Identifier: Apache-2.0
// SHA-256 through OpenSSL's libcrypto (a well-kept implementation, not ours).
#pragma once

#include <array>
#include <span>
#include <string>
#include <string_view>

namespace pooler {

using Digest = std::array<unsigned char, 32>;

// Incremental hashing: update() with every part, then finish().
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  Sha256& update(std::span<const unsigned char> bytes);
  Sha256& update(std::string_view text);
  // A length-prefixed field, so that ("ab", "c") and ("a", "bc") differ.
  Sha256& field(std::string_view text);
  Digest finish();

 private:
  void* context_;  // EVP_MD_CTX
};

Digest sha256(std::span<const unsigned char> bytes);
std::string hex(std::span<const unsigned char> bytes);

}  // namespace pooler
