// SPDX-License-Identifier: Apache-2.0
// POOLER_API marks what libpooler.so exports of the C++ API. The library is
// compiled with hidden visibility, so only declarations carrying this macro
// (and the C functions of pooler.h) can leave it; its version script
// (cmake/libpooler.map) admits nothing outside namespace pooler besides them,
// so spdlog and fmt, compiled in header-only, never do.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define POOLER_API __attribute__((visibility("default")))
#else
#define POOLER_API
#endif
