// SPDX-License-Identifier: Apache-2.0
/* A functional fake CUDA driver for the fake-NCCL harness (tests/fake_nccl.cpp):
 * built as libcuda.so.1 in a folder of its own (fake_gpu/) and loaded through
 * POOLER_CUDA_DRIVER, so that a Pooler can be built, run and checked on a
 * machine without a GPU. Eight "H200s" (sm_90, 132 SMs); device memory is host
 * memory (a CUdeviceptr is a host address); cubins (real ones, from NVRTC) are
 * accepted unread; kernel launches do nothing. Streams are real in one respect:
 * a stream is busy while the fake NCCL has a collective of it pending, which
 * the driver asks the test program through its exported function
 * fake_nccl_stream_busy (looked up in the global scope; absent: never busy), so
 * cuStreamQuery says CUDA_ERROR_NOT_READY and cuStreamSynchronize waits, as a
 * real stream behind a collective whose peer never came (cuCtxSynchronize: the
 * current context's streams and the legacy stream). Graph capture is
 * refused (CUDA_ERROR_NOT_SUPPORTED). Thread-safe: ranks are threads. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
enum {
  kSuccess = 0,
  kInvalidValue = 1,
  kOutOfMemory = 2,
  kInvalidDevice = 101,
  kInvalidContext = 201,
  kNotFound = 500,
  kNotReady = 600,
  kNotSupported = 801
};
enum { kDevices = 8 };

#define EXPORT __attribute__((visibility("default")))

static char g_contexts[kDevices];
static __thread void* t_current;

typedef int (*busy_query)(void* stream);

static int stream_busy(void* stream) {
  void* symbol = dlsym(RTLD_DEFAULT, "fake_nccl_stream_busy");
  busy_query query;
  if (symbol == NULL) return 0;
  memcpy(&query, &symbol, sizeof(query));
  return query(stream);
}

/* Every live stream and the context that made it: cuCtxSynchronize waits for
 * the streams of the current context only (and the legacy one), as the real one
 * does, so that a rank never waits for another rank's collective. */
enum { kMaxStreams = 4096 };
static pthread_mutex_t g_streams_mutex = PTHREAD_MUTEX_INITIALIZER;
static void* g_streams[kMaxStreams];
static void* g_stream_contexts[kMaxStreams];

static int context_busy(void* context) {
  if (stream_busy(NULL)) return 1;
  int busy = 0;
  pthread_mutex_lock(&g_streams_mutex);
  for (int i = 0; i < kMaxStreams && !busy; ++i) {
    if (g_streams[i] != NULL && g_stream_contexts[i] == context) busy = stream_busy(g_streams[i]);
  }
  pthread_mutex_unlock(&g_streams_mutex);
  return busy;
}

static void pause_briefly(void) {
  struct timespec pause = {0, 200000};
  nanosleep(&pause, NULL);
}

static CUresult fake_init(unsigned flags) {
  (void)flags;
  return kSuccess;
}
static CUresult fake_driver_get_version(int* version) {
  if (version == NULL) return kInvalidValue;
  *version = 13000;
  return kSuccess;
}
static CUresult fake_get_error_name(CUresult status, const char** name) {
  if (name == NULL) return kInvalidValue;
  switch (status) {
    case kSuccess:
      *name = "CUDA_SUCCESS";
      return kSuccess;
    case kInvalidValue:
      *name = "CUDA_ERROR_INVALID_VALUE";
      return kSuccess;
    case kOutOfMemory:
      *name = "CUDA_ERROR_OUT_OF_MEMORY";
      return kSuccess;
    case kInvalidDevice:
      *name = "CUDA_ERROR_INVALID_DEVICE";
      return kSuccess;
    case kInvalidContext:
      *name = "CUDA_ERROR_INVALID_CONTEXT";
      return kSuccess;
    case kNotReady:
      *name = "CUDA_ERROR_NOT_READY";
      return kSuccess;
    case kNotSupported:
      *name = "CUDA_ERROR_NOT_SUPPORTED";
      return kSuccess;
    default:
      *name = NULL;
      return kInvalidValue;
  }
}
static CUresult fake_get_error_string(CUresult status, const char** text) { return fake_get_error_name(status, text); }
static CUresult fake_device_get_count(int* count) {
  if (count == NULL) return kInvalidValue;
  *count = kDevices;
  return kSuccess;
}
static CUresult fake_device_get(int* device, int ordinal) {
  if (device == NULL) return kInvalidValue;
  if (ordinal < 0 || ordinal >= kDevices) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}
/* CUdevice_attribute values (cuda.h) with an H200's answers; any other is 1. */
static CUresult fake_device_get_attribute(int* value, int attribute, int device) {
  if (value == NULL) return kInvalidValue;
  if (device < 0 || device >= kDevices) return kInvalidDevice;
  switch (attribute) {
    case 75:
      *value = 9;
      break; /* compute capability major */
    case 76:
      *value = 0;
      break; /* minor */
    case 16:
      *value = 132;
      break; /* multiprocessors */
    case 97:
      *value = 232448;
      break; /* max shared memory per block, opt-in */
    case 8:
      *value = 49152;
      break; /* shared memory per block */
    case 81:
      *value = 233472;
      break; /* shared memory per multiprocessor */
    case 1:
      *value = 1024;
      break; /* max threads per block */
    case 39:
      *value = 2048;
      break; /* max threads per multiprocessor */
    case 38:
      *value = 52428800;
      break; /* L2 bytes */
    case 33:
      *value = device;
      break; /* PCI bus id */
    default:
      *value = 1;
      break;
  }
  return kSuccess;
}
static CUresult fake_device_get_name(char* name, int length, int device) {
  if (name == NULL || length < 1) return kInvalidValue;
  if (device < 0 || device >= kDevices) return kInvalidDevice;
  strncpy(name, "Fake H200 (tests/fake_gpu_driver.c)", (size_t)length - 1);
  name[length - 1] = '\0';
  return kSuccess;
}
static CUresult fake_device_get_pci_bus_id(char* id, int length, int device) {
  if (id == NULL || length < 13) return kInvalidValue;
  if (device < 0 || device >= kDevices) return kInvalidDevice;
  strncpy(id, "0000:00:00.0", (size_t)length - 1);
  id[5] = (char)('0' + device);
  return kSuccess;
}
static CUresult fake_device_can_access_peer(int* can, int device, int peer) {
  if (can == NULL) return kInvalidValue;
  *can = device != peer;
  return kSuccess;
}
static CUresult fake_primary_retain(void** context, int device) {
  if (context == NULL) return kInvalidValue;
  if (device < 0 || device >= kDevices) return kInvalidDevice;
  *context = &g_contexts[device];
  return kSuccess;
}
static CUresult fake_primary_release(int device) {
  return device >= 0 && device < kDevices ? kSuccess : kInvalidDevice;
}
static CUresult fake_ctx_get_current(void** context) {
  if (context == NULL) return kInvalidValue;
  *context = t_current;
  return kSuccess;
}
static CUresult fake_ctx_set_current(void* context) {
  t_current = context;
  return kSuccess;
}
static CUresult fake_ctx_get_device(int* device) {
  if (device == NULL) return kInvalidValue;
  if (t_current == NULL) return kInvalidContext;
  *device = (int)((char*)t_current - g_contexts);
  return kSuccess;
}
static CUresult fake_ctx_synchronize(void) {
  while (context_busy(t_current)) pause_briefly();
  return kSuccess;
}
static CUresult fake_mem_alloc(uint64_t* pointer, size_t bytes) {
  if (pointer == NULL || bytes == 0) return kInvalidValue;
  void* memory = NULL;
  if (posix_memalign(&memory, 256, (bytes + 255) / 256 * 256) != 0) return kOutOfMemory;
  memset(memory, 0xa5, bytes); /* not zero, as device memory is not */
  *pointer = (uint64_t)(uintptr_t)memory;
  return kSuccess;
}
static CUresult fake_mem_free(uint64_t pointer) {
  free((void*)(uintptr_t)pointer);
  return kSuccess;
}
static CUresult fake_mem_host_alloc(void** pointer, size_t bytes, unsigned flags) {
  (void)flags;
  if (pointer == NULL || bytes == 0) return kInvalidValue;
  *pointer = calloc(1, bytes);
  return *pointer != NULL ? kSuccess : kOutOfMemory;
}
static CUresult fake_mem_free_host(void* pointer) {
  free(pointer);
  return kSuccess;
}
static CUresult fake_mem_host_get_device_pointer(uint64_t* device, void* host, unsigned flags) {
  (void)flags;
  if (device == NULL || host == NULL) return kInvalidValue;
  *device = (uint64_t)(uintptr_t)host;
  return kSuccess;
}
static CUresult fake_pointer_get_attribute(void* data, int attribute, uint64_t pointer) {
  (void)attribute;
  (void)pointer;
  if (data == NULL) return kInvalidValue;
  int device = 0;
  if (t_current != NULL) device = (int)((char*)t_current - g_contexts);
  memcpy(data, &device, sizeof(device));
  return kSuccess;
}
static CUresult fake_memcpy(uint64_t to, uint64_t from, size_t bytes) {
  if ((to == 0 || from == 0) && bytes != 0) return kInvalidValue;
  memmove((void*)(uintptr_t)to, (const void*)(uintptr_t)from, bytes);
  return kSuccess;
}
static CUresult fake_memcpy_htod(uint64_t to, const void* from, size_t bytes) {
  return fake_memcpy(to, (uint64_t)(uintptr_t)from, bytes);
}
static CUresult fake_memcpy_dtoh(void* to, uint64_t from, size_t bytes) {
  return fake_memcpy((uint64_t)(uintptr_t)to, from, bytes);
}
static CUresult fake_memcpy_htod_async(uint64_t to, const void* from, size_t bytes, void* stream) {
  (void)stream;
  return fake_memcpy_htod(to, from, bytes);
}
static CUresult fake_memcpy_dtoh_async(void* to, uint64_t from, size_t bytes, void* stream) {
  (void)stream;
  return fake_memcpy_dtoh(to, from, bytes);
}
static CUresult fake_memcpy_dtod_async(uint64_t to, uint64_t from, size_t bytes, void* stream) {
  (void)stream;
  return fake_memcpy(to, from, bytes);
}
static CUresult fake_memset_d8(uint64_t to, unsigned char value, size_t count) {
  if (to == 0 && count != 0) return kInvalidValue;
  memset((void*)(uintptr_t)to, value, count);
  return kSuccess;
}
static CUresult fake_memset_d8_async(uint64_t to, unsigned char value, size_t count, void* stream) {
  (void)stream;
  return fake_memset_d8(to, value, count);
}
static CUresult fake_memset_d16_async(uint64_t to, unsigned short value, size_t count, void* stream) {
  (void)stream;
  if (to == 0 && count != 0) return kInvalidValue;
  for (size_t i = 0; i < count; ++i) memcpy((char*)(uintptr_t)to + 2 * i, &value, 2);
  return kSuccess;
}
static CUresult fake_stream_create(void** stream, unsigned flags) {
  (void)flags;
  if (stream == NULL) return kInvalidValue;
  void* made = malloc(1);
  if (made == NULL) return kOutOfMemory;
  pthread_mutex_lock(&g_streams_mutex);
  int slot = 0;
  while (slot < kMaxStreams && g_streams[slot] != NULL) ++slot;
  if (slot < kMaxStreams) {
    g_streams[slot] = made;
    g_stream_contexts[slot] = t_current;
  }
  pthread_mutex_unlock(&g_streams_mutex);
  if (slot == kMaxStreams) {
    free(made);
    return kOutOfMemory;
  }
  *stream = made;
  return kSuccess;
}
static CUresult fake_stream_destroy(void* stream) {
  pthread_mutex_lock(&g_streams_mutex);
  for (int i = 0; i < kMaxStreams; ++i) {
    if (g_streams[i] == stream) g_streams[i] = NULL;
  }
  pthread_mutex_unlock(&g_streams_mutex);
  /* The handle is not freed: the fake NCCL knows a pending collective by its stream's handle, and a
   * freed handle handed out again by the next cuStreamCreate (TSan's allocator does so at once) would
   * make a new stream look busy with a dead peer's collective, which no real stream inherits. One byte
   * a stream. */
  (void)stream;
  return kSuccess;
}
static CUresult fake_stream_query(void* stream) { return stream_busy(stream) ? kNotReady : kSuccess; }
static CUresult fake_stream_synchronize(void* stream) {
  while (stream_busy(stream)) pause_briefly();
  return kSuccess;
}
static CUresult fake_stream_is_capturing(void* stream, int* status) {
  (void)stream;
  if (status == NULL) return kInvalidValue;
  *status = 0; /* CU_STREAM_CAPTURE_STATUS_NONE */
  return kSuccess;
}
static CUresult fake_event_create(void** event, unsigned flags) {
  (void)flags;
  if (event == NULL) return kInvalidValue;
  *event = malloc(1);
  return *event != NULL ? kSuccess : kOutOfMemory;
}
static CUresult fake_event_destroy(void* event) {
  free(event);
  return kSuccess;
}
static CUresult fake_event_record(void* event, void* stream) {
  (void)event;
  (void)stream;
  return kSuccess;
}
static CUresult fake_event_synchronize(void* event) {
  (void)event;
  return kSuccess;
}
static CUresult fake_event_elapsed(float* ms, void* start, void* end) {
  (void)start;
  (void)end;
  if (ms == NULL) return kInvalidValue;
  *ms = 0.0f;
  return kSuccess;
}
static CUresult fake_library_load_data(void** library, const void* image, void* a, void** b, unsigned c, void* d,
                                       void** e, unsigned f) {
  (void)a, (void)b, (void)c, (void)d, (void)e, (void)f;
  if (library == NULL || image == NULL) return kInvalidValue;
  *library = malloc(1);
  return *library != NULL ? kSuccess : kOutOfMemory;
}
static CUresult fake_library_unload(void* library) {
  free(library);
  return kSuccess;
}
static char g_kernel;
static CUresult fake_library_get_kernel(void** kernel, void* library, const char* name) {
  if (kernel == NULL || library == NULL || name == NULL) return kInvalidValue;
  *kernel = &g_kernel;
  return kSuccess;
}
/* Every global is a fresh zeroed 4 KiB (kept until the process ends). */
static CUresult fake_library_get_global(uint64_t* pointer, size_t* bytes, void* library, const char* name) {
  if (library == NULL || name == NULL) return kInvalidValue;
  void* memory = calloc(1, 4096);
  if (memory == NULL) return kOutOfMemory;
  if (pointer != NULL) *pointer = (uint64_t)(uintptr_t)memory;
  if (bytes != NULL) *bytes = 4096;
  return kSuccess;
}
static CUresult fake_kernel_get_function(void** function, void* kernel, void* context) {
  (void)context;
  if (function == NULL || kernel == NULL) return kInvalidValue;
  *function = kernel;
  return kSuccess;
}
static CUresult fake_func_get_attribute(int* value, int attribute, void* function) {
  if (value == NULL || function == NULL) return kInvalidValue;
  *value = attribute == 0 ? 1024 : 0; /* max threads per block; registers, shared memory: 0 */
  return kSuccess;
}
static CUresult fake_func_set_attribute(void* function, int attribute, int value) {
  (void)attribute;
  (void)value;
  return function != NULL ? kSuccess : kInvalidValue;
}
static CUresult fake_occupancy_max_active_clusters(int* clusters, void* function, const void* config) {
  (void)config;
  if (clusters == NULL || function == NULL) return kInvalidValue;
  *clusters = 132;
  return kSuccess;
}
static CUresult fake_launch_kernel_ex(const void* config, void* function, void** parameters, void** extra) {
  (void)parameters;
  (void)extra;
  return config != NULL && function != NULL ? kSuccess : kInvalidValue;
}
static CUresult fake_not_supported(void) { return kNotSupported; }

struct entry {
  const char* name;
  void* function;
};
#define ENTRY(name, function) \
  { name, (void*)function }
static const struct entry g_entries[] = {
    ENTRY("cuInit", fake_init),
    ENTRY("cuDriverGetVersion", fake_driver_get_version),
    ENTRY("cuGetErrorName", fake_get_error_name),
    ENTRY("cuGetErrorString", fake_get_error_string),
    ENTRY("cuDeviceGet", fake_device_get),
    ENTRY("cuDeviceGetCount", fake_device_get_count),
    ENTRY("cuDeviceGetAttribute", fake_device_get_attribute),
    ENTRY("cuDeviceGetName", fake_device_get_name),
    ENTRY("cuDeviceGetPCIBusId", fake_device_get_pci_bus_id),
    ENTRY("cuDeviceCanAccessPeer", fake_device_can_access_peer),
    ENTRY("cuDevicePrimaryCtxRetain", fake_primary_retain),
    ENTRY("cuDevicePrimaryCtxRelease", fake_primary_release),
    ENTRY("cuCtxGetCurrent", fake_ctx_get_current),
    ENTRY("cuCtxSetCurrent", fake_ctx_set_current),
    ENTRY("cuCtxSynchronize", fake_ctx_synchronize),
    ENTRY("cuCtxGetDevice", fake_ctx_get_device),
    ENTRY("cuMemAlloc", fake_mem_alloc),
    ENTRY("cuMemFree", fake_mem_free),
    ENTRY("cuMemHostAlloc", fake_mem_host_alloc),
    ENTRY("cuMemFreeHost", fake_mem_free_host),
    ENTRY("cuMemHostGetDevicePointer", fake_mem_host_get_device_pointer),
    ENTRY("cuPointerGetAttribute", fake_pointer_get_attribute),
    ENTRY("cuMemcpyHtoD", fake_memcpy_htod),
    ENTRY("cuMemcpyDtoH", fake_memcpy_dtoh),
    ENTRY("cuMemcpyDtoD", fake_memcpy),
    ENTRY("cuMemcpyHtoDAsync", fake_memcpy_htod_async),
    ENTRY("cuMemcpyDtoHAsync", fake_memcpy_dtoh_async),
    ENTRY("cuMemcpyDtoDAsync", fake_memcpy_dtod_async),
    ENTRY("cuMemsetD8", fake_memset_d8),
    ENTRY("cuMemsetD8Async", fake_memset_d8_async),
    ENTRY("cuMemsetD16Async", fake_memset_d16_async),
    ENTRY("cuStreamCreate", fake_stream_create),
    ENTRY("cuStreamDestroy", fake_stream_destroy),
    ENTRY("cuStreamSynchronize", fake_stream_synchronize),
    ENTRY("cuStreamQuery", fake_stream_query),
    ENTRY("cuStreamIsCapturing", fake_stream_is_capturing),
    ENTRY("cuEventCreate", fake_event_create),
    ENTRY("cuEventDestroy", fake_event_destroy),
    ENTRY("cuEventRecord", fake_event_record),
    ENTRY("cuEventSynchronize", fake_event_synchronize),
    ENTRY("cuEventElapsedTime", fake_event_elapsed),
    ENTRY("cuLibraryLoadData", fake_library_load_data),
    ENTRY("cuLibraryUnload", fake_library_unload),
    ENTRY("cuLibraryGetKernel", fake_library_get_kernel),
    ENTRY("cuLibraryGetGlobal", fake_library_get_global),
    ENTRY("cuKernelGetFunction", fake_kernel_get_function),
    ENTRY("cuFuncGetAttribute", fake_func_get_attribute),
    ENTRY("cuFuncSetAttribute", fake_func_set_attribute),
    ENTRY("cuOccupancyMaxActiveClusters", fake_occupancy_max_active_clusters),
    ENTRY("cuLaunchKernelEx", fake_launch_kernel_ex),
};

EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** function, int version, unsigned long long flags,
                                    int* status) {
  (void)version;
  (void)flags;
  if (symbol == NULL || function == NULL) return kInvalidValue;
  for (size_t i = 0; i < sizeof(g_entries) / sizeof(g_entries[0]); ++i) {
    if (strcmp(symbol, g_entries[i].name) == 0) {
      *function = g_entries[i].function;
      if (status != NULL) *status = 0;
      return kSuccess;
    }
  }
  if (strncmp(symbol, "cu", 2) == 0) { /* graphs, capture: not here */
    *function = (void*)fake_not_supported;
    if (status != NULL) *status = 0;
    return kSuccess;
  }
  *function = NULL;
  if (status != NULL) *status = 1;
  return kNotFound;
}

EXPORT CUresult cuDriverGetVersion(int* version) { return fake_driver_get_version(version); }
EXPORT CUresult cuInit(unsigned flags) { return fake_init(flags); }
