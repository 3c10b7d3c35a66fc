// SPDX-License-Identifier: Apache-2.0
#include "runtime/jit/sha256.hpp"

#include <openssl/evp.h>

#include <cstdint>

#include "pooler/error.hpp"

namespace pooler {
namespace {

EVP_MD_CTX* as_context(void* context) { return static_cast<EVP_MD_CTX*>(context); }

void require(int ok, const char* call) {
  if (ok != 1) {
    throw Error(std::string("OpenSSL ") + call + " failed while hashing");
  }
}

}  // namespace

Sha256::Sha256() : context_(EVP_MD_CTX_new()) {
  if (context_ == nullptr) {
    throw Error("OpenSSL EVP_MD_CTX_new failed: out of memory");
  }
  require(EVP_DigestInit_ex(as_context(context_), EVP_sha256(), nullptr), "EVP_DigestInit_ex");
}

Sha256::~Sha256() { EVP_MD_CTX_free(as_context(context_)); }

Sha256& Sha256::update(std::span<const unsigned char> bytes) {
  require(EVP_DigestUpdate(as_context(context_), bytes.data(), bytes.size()), "EVP_DigestUpdate");
  return *this;
}

Sha256& Sha256::update(std::string_view text) {
  return update(std::span(reinterpret_cast<const unsigned char*>(text.data()), text.size()));
}

Sha256& Sha256::field(std::string_view text) {
  unsigned char length[8];
  std::uint64_t size = text.size();
  for (unsigned char& byte : length) {
    byte = static_cast<unsigned char>(size & 0xff);
    size >>= 8;
  }
  update(std::span<const unsigned char>(length, sizeof(length)));
  return update(text);
}

Digest Sha256::finish() {
  Digest digest{};
  unsigned int size = 0;
  require(EVP_DigestFinal_ex(as_context(context_), digest.data(), &size), "EVP_DigestFinal_ex");
  return digest;
}

Digest sha256(std::span<const unsigned char> bytes) { return Sha256().update(bytes).finish(); }

std::string hex(std::span<const unsigned char> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string text;
  text.reserve(bytes.size() * 2);
  for (unsigned char byte : bytes) {
    text += digits[byte >> 4];
    text += digits[byte & 0xf];
  }
  return text;
}

}  // namespace pooler
