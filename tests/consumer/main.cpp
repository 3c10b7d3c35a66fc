// SPDX-License-Identifier: Apache-2.0
// Prints the installed library's version and the device count through the C
// ABI, and names the C++ API's types, so that both headers compile against the
// include folders pooler::pooler carries. Exit 0 also without a GPU.
#include <pooler/pooler.h>
#include <pooler/pooler.hpp>

#include <cstdio>

int main() {
  std::printf("pooler %s (ABI %d)\n", pooler_version(), pooler_abi_version());
  if (pooler_abi_version() != POOLER_ABI_VERSION) {
    std::printf("ABI mismatch: header %d, library %d\n", POOLER_ABI_VERSION, pooler_abi_version());
    return 1;
  }
  int count = 0;
  const pooler_status status = pooler_device_count(&count);
  if (status == POOLER_OK) {
    std::printf("devices: %d\n", count);
  } else if (status == POOLER_NO_DRIVER) {
    std::printf("devices: none (%s)\n", pooler_last_error());
  } else {
    std::printf("pooler_device_count failed: %s: %s\n", pooler_status_name(status), pooler_last_error());
    return 1;
  }
  const pooler::PoolerOptions options;  // the C++ API's header compiles too
  std::printf("default P x H: %d x %d\n", options.pooled, options.hidden);
  return 0;
}
