// Stand-in "gcu" CustomDevice plug-in for tests: NOT an Enflame GCU.
//
// This file is the device runtime: it registers Paddle custom device type "gcu" (sub type
// "standin") with devices whose "device memory" is host memory. The same .so also carries
// reference implementations of paddle-custom-gcu's LLM custom ops (standin_ops_*.cc, registered
// with PD_BUILD_OP under the real names, input orders, attributes, outputs and in-place maps:
// flash_attn_var_len_gcu, reshape_and_cache_flash_gcu, fused_rotary_embedding_gcu, rms_norm_gcu,
// fused_add_rms_norm_op, linear_quant_gcu, topk_softmax_gcu, moe_align_block_size_gcu,
// fused_moe_kernel_gcu). Paddle registers those ops only when someone calls
// load_op_meta_info_and_register_op on the .so (the stand-in `paddle_custom_device.gcu.ops` does
// on import, as the real wheel's does). No phi kernels are registered: every other op runs
// through Paddle's CPU kernels (FLAGS_enable_api_kernel_fallback, on by default; ops on views need
// FLAGS_use_stride_kernel=0).
//
// Collectives: the xccl_* callbacks that Paddle's `xccl` process-group backend calls (ECCL on a
// real GCU) are standin_xccl.cc's, registered by InitPlugin below: the rank processes of one host
// meet in a POSIX shared-memory segment named by the unique id (barrier + copy / reduce, bounded
// waits), so tensor parallelism over gcu:0 / gcu:1 runs. Paddle calls get_unique_id_size /
// get_unique_id (rank 0), comm_init_rank (each rank, at its first collective), all_reduce (the
// engine's only collective; barrier() is a one-element all_reduce), broadcast, reduce,
// all_gather, reduce_scatter through paddle.distributed; send / recv / all_to_all are absent.
//
// What it models: the op signatures and their reference numerics (fp32 exact up to summation
// order; bf16 / fp16 through float), the per-device memory accounting below, the device and
// place plumbing, collectives between processes of one host. What it does not model: any GCU
// kernel's speed, TopsFA / topsvllm limits (head sizes, block sizes, dtype support), real bf16 /
// fp16 numerics of the hardware, the stub phi kernels of the real plug-in (the "broken" build
// variant stubs rms_norm_gcu instead), real memory behaviour, streams, ECCL's speed, topology,
// multi-host rendezvous or asynchronous completion.
//
// Runtime details:
//   - device memory is accounted per device: an allocation that would take the device past its
//     total memory fails (C_FAILED), so out-of-memory paths are testable;
//   - device_memory_stats / get_device_properties report that total (and the free part);
//   - h2d / d2h / d2d / p2p copies (sync and async) are memcpy; streams and events are no-ops.
// Total memory per device: env STANDIN_GCU_TOTAL_MEMORY_MB (default 4096), read once at load.
// Env STANDIN_GCU_DEVICE_COUNT (default 2, 1..8) sets the number of devices.
// Env STANDIN_GCU_USAGE_DIR: when set, every device allocation rewrites
// <dir>/standin_gcu.<pid>.txt with one line per device, "gcu:<i> used <bytes> peak <bytes>", so a
// test can see from outside which device a process (e.g. a Triton stub) put its memory on.
// Env STANDIN_GCU_CALL_LOG=<path>: every custom-op call appends "<op> [<dims of first input>]",
// every collective "xccl_<name> [<element count>]" (comm_init_rank: "[<ranks>]").
// Env STANDIN_GCU_XCCL_TIMEOUT_S (default 300): how long a collective waits for its peers.
//
// Written against paddle/phi/backends/device_ext.h of the installed wheel (tests/gcu_standin/build.py
// compiles it with the machine's g++ and links the ops against the wheel's libpaddle.so). No static
// objects with destructors: Paddle may call into the plug-in while the process exits.

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

#include "paddle/phi/backends/device_base.h"  // phi::DeviceProp, filled by get_device_properties
#include "paddle/phi/backends/device_ext.h"

void StandinRegisterCollectives(C_DeviceInterface* f);  // standin_xccl.cc

// The opaque handles of device_ext.h: streams and events only remember their device.
struct C_Stream_st {
  int device;
};
struct C_Event_st {
  int device;
};

namespace {

constexpr size_t kMaxDevices = 8;
constexpr size_t kHeader = 64;  // bytes before each allocation: its size, keeps 64-byte alignment
constexpr uint64_t kMagic = 0x5354414e44494e47ULL;  // "STANDING"

size_t g_device_count = 2;
size_t g_total_bytes = 4096ULL << 20;
std::atomic<size_t> g_used[kMaxDevices];
std::atomic<size_t> g_peak[kMaxDevices];
thread_local int g_current_device = 0;
char g_usage_path[4096] = "";  // empty: no usage file
std::atomic<bool> g_usage_busy{false};

size_t env_size(const char* name, size_t fallback, size_t lo, size_t hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  unsigned long long x = std::strtoull(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) {
    std::fprintf(stderr, "standin_gcu: ignoring %s=%s (want an integer in [%zu, %zu]), using %zu\n",
                 name, v, lo, hi, fallback);
    return fallback;
  }
  return static_cast<size_t>(x);
}

bool valid(const C_Device d) { return d != nullptr && d->id >= 0 && static_cast<size_t>(d->id) < g_device_count; }

// -- device management ---------------------------------------------------------------------
void ReadConfig() {  // from InitPlugin, before Paddle asks anything
  g_device_count = env_size("STANDIN_GCU_DEVICE_COUNT", 2, 1, kMaxDevices);
  g_total_bytes = env_size("STANDIN_GCU_TOTAL_MEMORY_MB", 4096, 1, 1ULL << 24) << 20;
  const char* dir = std::getenv("STANDIN_GCU_USAGE_DIR");
  if (dir != nullptr && *dir != '\0') {
    std::snprintf(g_usage_path, sizeof(g_usage_path), "%s/standin_gcu.%ld.txt", dir, static_cast<long>(getpid()));
  }
}

// Rewrites the usage file (write to a temporary name, then rename: readers never see half a file).
// Skipped when another thread is writing it; the next allocation writes the newer numbers.
void WriteUsage() {
  if (g_usage_path[0] == '\0' || g_usage_busy.exchange(true)) return;
  char tmp[4200];
  std::snprintf(tmp, sizeof(tmp), "%s.tmp", g_usage_path);
  if (FILE* f = std::fopen(tmp, "w")) {
    for (size_t i = 0; i < g_device_count; ++i) {
      std::fprintf(f, "gcu:%zu used %zu peak %zu\n", i, g_used[i].load(), g_peak[i].load());
    }
    std::fclose(f);
    std::rename(tmp, g_usage_path);
  }
  g_usage_busy.store(false);
}

C_Status Initialize() { return C_SUCCESS; }

C_Status Finalize() { return C_SUCCESS; }

C_Status InitDevice(const C_Device d) {
  if (!valid(d)) return C_ERROR;
  g_current_device = d->id;
  return C_SUCCESS;
}

C_Status SetDevice(const C_Device d) {
  if (!valid(d)) return C_ERROR;
  g_current_device = d->id;
  return C_SUCCESS;
}

C_Status GetDevice(const C_Device d) {
  d->id = g_current_device;
  return C_SUCCESS;
}

C_Status DeinitDevice(const C_Device d) { return valid(d) ? C_SUCCESS : C_ERROR; }

C_Status GetDeviceCount(size_t* count) {
  *count = g_device_count;
  return C_SUCCESS;
}

C_Status GetDeviceList(size_t* devices) {
  for (size_t i = 0; i < g_device_count; ++i) devices[i] = i;
  return C_SUCCESS;
}

// -- accounted device memory ---------------------------------------------------------------
C_Status DeviceAllocate(const C_Device d, void** ptr, size_t size) {
  *ptr = nullptr;
  if (!valid(d)) return C_ERROR;
  std::atomic<size_t>& used = g_used[d->id];
  size_t before = used.load();
  do {
    if (size > g_total_bytes || before > g_total_bytes - size) {
      std::fprintf(stderr,
                   "standin_gcu: out of memory on gcu:%d: %zu bytes requested, %zu of %zu in use\n",
                   d->id, size, before, g_total_bytes);
      return C_FAILED;
    }
  } while (!used.compare_exchange_weak(before, before + size));
  void* raw = nullptr;
  if (posix_memalign(&raw, kHeader, kHeader + size) != 0) {
    used.fetch_sub(size);
    return C_FAILED;
  }
  auto* header = static_cast<uint64_t*>(raw);
  header[0] = kMagic;
  header[1] = size;
  header[2] = static_cast<uint64_t>(d->id);
  size_t now = before + size;
  size_t peak = g_peak[d->id].load();
  while (now > peak && !g_peak[d->id].compare_exchange_weak(peak, now)) {
  }
  *ptr = static_cast<char*>(raw) + kHeader;
  WriteUsage();
  return C_SUCCESS;
}

C_Status DeviceDeallocate(const C_Device d, void* ptr, size_t /*size*/) {
  if (ptr == nullptr) return C_SUCCESS;
  void* raw = static_cast<char*>(ptr) - kHeader;
  auto* header = static_cast<uint64_t*>(raw);
  if (header[0] != kMagic || header[2] >= g_device_count) {
    std::fprintf(stderr, "standin_gcu: free of a pointer not allocated here (%p)\n", ptr);
    return C_ERROR;
  }
  g_used[header[2]].fetch_sub(header[1]);
  header[0] = 0;
  std::free(raw);
  (void)d;
  return C_SUCCESS;
}

C_Status DeviceMemorySet(const C_Device, void* ptr, unsigned char value, size_t size) {
  std::memset(ptr, value, size);
  return C_SUCCESS;
}

// Host (pinned) and unified memory: plain host memory, not counted against the device.
C_Status HostAllocate(const C_Device, void** ptr, size_t size) {
  *ptr = std::malloc(size == 0 ? 1 : size);
  return *ptr ? C_SUCCESS : C_FAILED;
}

C_Status HostDeallocate(const C_Device, void* ptr, size_t) {
  std::free(ptr);
  return C_SUCCESS;
}

C_Status MemoryStats(const C_Device d, size_t* total, size_t* free_bytes) {
  if (!valid(d)) return C_ERROR;
  size_t used = g_used[d->id].load();
  *total = g_total_bytes;
  *free_bytes = used >= g_total_bytes ? 0 : g_total_bytes - used;
  return C_SUCCESS;
}

C_Status MinChunkSize(const C_Device, size_t* size) {
  *size = 512;
  return C_SUCCESS;
}

C_Status ExtraPaddingSize(const C_Device, size_t* size) {
  *size = 0;
  return C_SUCCESS;
}

// -- copies ------------------------------------------------------------------------------------
C_Status Copy(const C_Device, void* dst, const void* src, size_t size) {
  if (size) std::memcpy(dst, src, size);
  return C_SUCCESS;
}

C_Status AsyncCopy(const C_Device, C_Stream, void* dst, const void* src, size_t size) {
  if (size) std::memcpy(dst, src, size);
  return C_SUCCESS;
}

C_Status CopyP2P(const C_Device, const C_Device, void* dst, const void* src, size_t size) {
  if (size) std::memcpy(dst, src, size);
  return C_SUCCESS;
}

C_Status AsyncCopyP2P(const C_Device, const C_Device, C_Stream, void* dst, const void* src, size_t size) {
  if (size) std::memcpy(dst, src, size);
  return C_SUCCESS;
}

// -- streams and events: everything is synchronous ---------------------------------------------
C_Status CreateStream(const C_Device d, C_Stream* stream) {
  *stream = new C_Stream_st{d ? d->id : 0};
  return C_SUCCESS;
}

C_Status DestroyStream(const C_Device, C_Stream stream) {
  delete stream;
  return C_SUCCESS;
}

C_Status QueryStream(const C_Device, C_Stream) { return C_SUCCESS; }

C_Status AddCallback(const C_Device d, C_Stream s, C_Callback callback, void* user_data) {
  C_Status status = C_SUCCESS;
  callback(d, s, user_data, &status);  // the stream is always idle: run it now
  return status;
}

C_Status CreateEvent(const C_Device d, C_Event* event) {
  *event = new C_Event_st{d ? d->id : 0};
  return C_SUCCESS;
}

C_Status RecordEvent(const C_Device, C_Stream, C_Event) { return C_SUCCESS; }

C_Status DestroyEvent(const C_Device, C_Event event) {
  delete event;
  return C_SUCCESS;
}

C_Status QueryEvent(const C_Device, C_Event) { return C_SUCCESS; }
C_Status SyncDevice(const C_Device) { return C_SUCCESS; }
C_Status SyncStream(const C_Device, C_Stream) { return C_SUCCESS; }
C_Status SyncEvent(const C_Device, C_Event) { return C_SUCCESS; }
C_Status StreamWaitEvent(const C_Device, C_Stream, C_Event) { return C_SUCCESS; }

// -- info ----------------------------------------------------------------------------------------
C_Status GetDeviceProperties(const C_Device d, void* out) {
  if (!valid(d) || out == nullptr) return C_ERROR;
  auto* prop = static_cast<phi::DeviceProp*>(out);
  prop->name = "standin-gcu (host memory, not an Enflame GCU)";
  prop->deviceMajor = 0;
  prop->deviceMinor = 1;
  prop->totalGlobalMem = g_total_bytes;
  prop->multiProcessorCount = 1;
  prop->isMultiGpuBoard = false;
  prop->integrated = true;
  return C_SUCCESS;
}

C_Status ComputeCapability(const C_Device, size_t* v) {
  *v = 1;
  return C_SUCCESS;
}

C_Status RuntimeVersion(const C_Device, size_t* v) {
  *v = 1;
  return C_SUCCESS;
}

C_Status DriverVersion(const C_Device, size_t* v) {
  *v = 1;
  return C_SUCCESS;
}

C_Status Unsupported(const C_Device, bool* supported) {
  *supported = false;
  return C_SUCCESS;
}

}  // namespace

extern "C" {

// Tests read the accounting directly (ctypes) to cross-check paddle's numbers.
size_t standin_gcu_used_bytes(int device) {
  return device >= 0 && static_cast<size_t>(device) < kMaxDevices ? g_used[device].load() : 0;
}
size_t standin_gcu_peak_bytes(int device) {
  return device >= 0 && static_cast<size_t>(device) < kMaxDevices ? g_peak[device].load() : 0;
}
size_t standin_gcu_total_bytes() { return g_total_bytes; }

void InitPlugin(CustomRuntimeParams* params) {
  PADDLE_CUSTOM_RUNTIME_CHECK_VERSION(params);
  ReadConfig();
  params->device_type = const_cast<char*>("gcu");
  params->sub_device_type = const_cast<char*>("standin");

  C_DeviceInterface* f = params->interface;
  std::memset(reinterpret_cast<void*>(f), 0, sizeof(C_DeviceInterface));
  f->size = sizeof(C_DeviceInterface);

  f->initialize = Initialize;
  f->finalize = Finalize;
  f->init_device = InitDevice;
  f->set_device = SetDevice;
  f->get_device = GetDevice;
  f->deinit_device = DeinitDevice;

  f->create_stream = CreateStream;
  f->destroy_stream = DestroyStream;
  f->query_stream = QueryStream;
  f->stream_add_callback = AddCallback;
  f->create_event = CreateEvent;
  f->record_event = RecordEvent;
  f->destroy_event = DestroyEvent;
  f->query_event = QueryEvent;
  f->synchronize_device = SyncDevice;
  f->synchronize_stream = SyncStream;
  f->synchronize_event = SyncEvent;
  f->stream_wait_event = StreamWaitEvent;

  f->device_memory_allocate = DeviceAllocate;
  f->device_memory_deallocate = DeviceDeallocate;
  f->device_memory_set = DeviceMemorySet;
  f->host_memory_allocate = HostAllocate;
  f->host_memory_deallocate = HostDeallocate;
  f->unified_memory_allocate = HostAllocate;
  f->unified_memory_deallocate = HostDeallocate;

  f->memory_copy_h2d = Copy;
  f->memory_copy_d2h = Copy;
  f->memory_copy_d2d = Copy;
  f->memory_copy_p2p = CopyP2P;
  f->async_memory_copy_h2d = AsyncCopy;
  f->async_memory_copy_d2h = AsyncCopy;
  f->async_memory_copy_d2d = AsyncCopy;
  f->async_memory_copy_p2p = AsyncCopyP2P;

  f->get_device_count = GetDeviceCount;
  f->get_device_list = GetDeviceList;
  f->device_memory_stats = MemoryStats;
  f->device_min_chunk_size = MinChunkSize;
  f->device_extra_padding_size = ExtraPaddingSize;
  f->get_device_properties = GetDeviceProperties;
  f->get_compute_capability = ComputeCapability;
  f->get_runtime_version = RuntimeVersion;
  f->get_driver_version = DriverVersion;
  f->is_float16_supported = Unsupported;
  f->is_bfloat16_supported = Unsupported;
  f->is_dnn_supported = Unsupported;

  StandinRegisterCollectives(f);  // xccl_* over POSIX shared memory (standin_xccl.cc)
}

}  // extern "C"
