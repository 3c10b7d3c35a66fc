/* A fake CUDA driver, built as libcuda.so.1 in a folder of its own and loaded
 * through POOLER_CUDA_DRIVER: it is new enough (CUDA 13.0), resolves every
 * entry point, and its cuInit fails with CUDA_ERROR_NO_DEVICE, as the real one
 * does with CUDA_VISIBLE_DEVICES="" or without the device nodes. Every other
 * call fails with CUDA_ERROR_NOT_INITIALIZED; pooler must never get that far. */
#include <string.h>

typedef int CUresult;
enum { kSuccess = 0, kInvalidValue = 1, kNotInitialized = 3, kNoDevice = 100, kNotFound = 500 };

static CUresult fake_init(unsigned flags) {
  (void)flags;
  return kNoDevice;
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
 * driver after a failed cuInit. */
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
