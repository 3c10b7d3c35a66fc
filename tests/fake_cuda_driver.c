// SPDX-License-Identifier: Apache-2.0
/* A fake CUDA driver, built as libcuda.so.1 in a folder of its own and loaded
 * through POOLER_CUDA_DRIVER: it is new enough (CUDA 13.0), resolves every
 * entry point, and its cuInit fails with CUDA_ERROR_NO_DEVICE, as the real one
 * does with CUDA_VISIBLE_DEVICES="" or without the device nodes. Every other
 * call fails with CUDA_ERROR_NOT_INITIALIZED; pooler must never get that far.
 *
 * With FAKE_CUDA_INIT=ok, cuInit succeeds and just enough works to load a
 * cubin: the current context (always NULL), cuLibraryLoadData and
 * cuLibraryUnload. cuLibraryLoadData refuses every image with
 * CUDA_ERROR_NO_BINARY_FOR_GPU when FAKE_CUDA_REJECT_ALL is set, and with
 * CUDA_ERROR_INVALID_IMAGE an image whose ELF e_ident padding (bytes 9-15,
 * unused by ELF and by pooler's checks) starts with FAKE_CUDA_REJECT_MARKER. */
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
enum {
  kSuccess = 0,
  kInvalidValue = 1,
  kNotInitialized = 3,
  kNoDevice = 100,
  kInvalidImage = 200,
  kNoBinaryForGpu = 209,
  kNotFound = 500
};

static int initialised(void) {
  const char* mode = getenv("FAKE_CUDA_INIT");
  return mode != NULL && strcmp(mode, "ok") == 0;
}

static CUresult fake_init(unsigned flags) {
  (void)flags;
  return initialised() ? kSuccess : kNoDevice;
}

static CUresult fake_ctx_get_current(void** context) {
  if (!initialised()) return kNotInitialized;
  if (context == NULL) return kInvalidValue;
  *context = NULL;
  return kSuccess;
}

static CUresult fake_ctx_set_current(void* context) {
  (void)context;
  return initialised() ? kSuccess : kNotInitialized;
}

static char fake_library; /* the address every loaded "library" gets */

static CUresult fake_library_load_data(void** library, const void* image, void* jit_options, void** jit_values,
                                       unsigned jit_count, void* library_options, void** library_values,
                                       unsigned library_count) {
  (void)jit_options;
  (void)jit_values;
  (void)jit_count;
  (void)library_options;
  (void)library_values;
  (void)library_count;
  if (!initialised()) return kNotInitialized;
  if (library == NULL || image == NULL) return kInvalidValue;
  if (getenv("FAKE_CUDA_REJECT_ALL") != NULL) return kNoBinaryForGpu;
  const char* marker = getenv("FAKE_CUDA_REJECT_MARKER");
  if (marker != NULL && *marker != '\0' && strlen(marker) <= 7 &&
      memcmp((const unsigned char*)image + 9, marker, strlen(marker)) == 0) {
    return kInvalidImage;
  }
  *library = &fake_library;
  return kSuccess;
}

static CUresult fake_library_unload(void* library) {
  if (!initialised()) return kNotInitialized;
  return library == &fake_library ? kSuccess : kInvalidValue;
}

static CUresult fake_driver_get_version(int* version) {
  if (version == NULL) return kInvalidValue;
  *version = 13000;
  return kSuccess;
}

static CUresult fake_get_error_name(CUresult status, const char** name) {
  if (name == NULL) return kInvalidValue;
  switch (status) {
    case kNoDevice:
      *name = "CUDA_ERROR_NO_DEVICE";
      return kSuccess;
    case kNotInitialized:
      *name = "CUDA_ERROR_NOT_INITIALIZED";
      return kSuccess;
    case kInvalidImage:
      *name = "CUDA_ERROR_INVALID_IMAGE";
      return kSuccess;
    case kNoBinaryForGpu:
      *name = "CUDA_ERROR_NO_BINARY_FOR_GPU";
      return kSuccess;
    default:
      *name = NULL;
      return kInvalidValue;
  }
}

static CUresult fake_get_error_string(CUresult status, const char** text) {
  if (text == NULL) return kInvalidValue;
  *text = status == kNoDevice ? "no CUDA-capable device is detected (fake driver)" : NULL;
  return *text != NULL ? kSuccess : kInvalidValue;
}

/* Stands in for every other entry point; any call of it means pooler used the
 * driver after a failed cuInit (or, with FAKE_CUDA_INIT=ok, beyond loading). */
static CUresult fake_not_initialized(void) { return kNotInitialized; }

__attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(const char* symbol, void** function, int version,
                                                                    unsigned long long flags, int* status) {
  (void)version;
  (void)flags;
  if (symbol == NULL || function == NULL) return kInvalidValue;
  if (strcmp(symbol, "cuInit") == 0) {
    *function = (void*)fake_init;
  } else if (strcmp(symbol, "cuDriverGetVersion") == 0) {
    *function = (void*)fake_driver_get_version;
  } else if (strcmp(symbol, "cuGetErrorName") == 0) {
    *function = (void*)fake_get_error_name;
  } else if (strcmp(symbol, "cuGetErrorString") == 0) {
    *function = (void*)fake_get_error_string;
  } else if (strcmp(symbol, "cuCtxGetCurrent") == 0) {
    *function = (void*)fake_ctx_get_current;
  } else if (strcmp(symbol, "cuCtxSetCurrent") == 0) {
    *function = (void*)fake_ctx_set_current;
  } else if (strcmp(symbol, "cuLibraryLoadData") == 0) {
    *function = (void*)fake_library_load_data;
  } else if (strcmp(symbol, "cuLibraryUnload") == 0) {
    *function = (void*)fake_library_unload;
  } else if (strncmp(symbol, "cu", 2) == 0) {
    *function = (void*)fake_not_initialized;
  } else {
    *function = NULL;
    if (status != NULL) *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return kNotFound;
  }
  if (status != NULL) *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
  return kSuccess;
}

__attribute__((visibility("default"))) CUresult cuDriverGetVersion(int* version) {
  return fake_driver_get_version(version);
}

__attribute__((visibility("default"))) CUresult cuInit(unsigned flags) { return fake_init(flags); }
