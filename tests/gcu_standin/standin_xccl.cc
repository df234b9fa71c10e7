// Stand-in collectives of the "gcu" CustomDevice plug-in (tests only): NOT Enflame's ECCL.
//
// Paddle's `xccl` process-group backend (PADDLE_DISTRI_BACKEND=xccl, PADDLE_XCCL_BACKEND=gcu) calls
// the plug-in's xccl_* callbacks of device_ext.h; on a real GCU those are ECCL. Here they connect
// the ranks of one host (one process per rank, as the engine's tensor-parallel workers) through
// POSIX shared memory, with plain code meant to be obviously right, not fast:
//   - the unique id (xccl_get_unique_id, rank 0; Paddle passes it to the other ranks through its
//     TCP store) is a NUL-padded name "/standin_gcu_xccl.<pid>.<sequence>.<nanoseconds>";
//   - xccl_comm_init_rank: every rank opens (creating if needed) the segment of that name, sizes
//     it, maps it, writes its pid and waits until all `nranks` ranks have attached; then each rank
//     unlinks the name (idempotent), so nothing is left in /dev/shm once a communicator is up,
//     whatever happens to the processes afterwards;
//   - the segment holds a sense-reversing barrier and one slot of kSlotBytes per rank; every
//     collective moves its data in chunks that fit a slot: each rank copies its chunk into its
//     slot, barrier, each rank reads the slots it needs (sum / max / ... or copy) into its
//     output, barrier (so no slot is overwritten while someone still reads it). In-place calls
//     (send == recv) are safe: outputs are computed from the slots only;
//   - every wait is bounded: env STANDIN_GCU_XCCL_TIMEOUT_S (default 300 s, read at each wait);
//     a wait also ends when a peer's pid no longer exists or a peer gave up before. The call then
//     fails (C_FAILED, a line on stderr saying why), the communicator is marked failed so every
//     rank's later collectives fail at once, and Paddle raises.
// Implemented: get_unique_id_size, get_unique_id, comm_init_rank, destroy_comm, get_comm_name,
// all_reduce, broadcast, reduce, all_gather, reduce_scatter (ops SUM, AVG, MAX, MIN, PRODUCT on
// float32/64, float16 and bfloat16 (through float), int8/16/32/64, uint8; broadcast and all_gather
// copy bytes of any dtype), group_start / group_end (no-ops: every call is synchronous). Not
// implemented (Paddle raises "... is not implemented on gcu device"): send / recv / all_to_all.
// Streams are ignored: the collectives are synchronous, as everything else of the stand-in.
// Env STANDIN_GCU_CALL_LOG=<path>: each collective appends "xccl_<name> [<element count>]" (as the
// ops do), comm_init_rank / destroy_comm / get_comm_name "[<ranks>]", get_unique_id "[<id bytes>]".

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "paddle/phi/backends/device_ext.h"

namespace {

constexpr size_t kIdBytes = 64;
constexpr size_t kMaxRanks = 64;
constexpr size_t kSlotBytes = 1 << 20;  // per rank; a collective larger than this runs in chunks
constexpr char kPrefix[] = "/standin_gcu_xccl.";

// The segment's header; the slots follow at kHeaderBytes. A fresh segment is all zero bytes.
struct Shared {
  std::atomic<uint32_t> attached;  // ranks that mapped the segment
  std::atomic<uint32_t> count;     // ranks inside the current barrier
  std::atomic<uint32_t> sense;     // flipped by the last rank to arrive
  std::atomic<uint32_t> failed;    // a rank gave up: every later wait fails at once
  int32_t pid[kMaxRanks];
};
constexpr size_t kHeaderBytes = 4096;
static_assert(sizeof(Shared) <= kHeaderBytes, "header too large");

}  // namespace

struct C_CCLComm_st {
  char name[kIdBytes];
  size_t rank;
  size_t nranks;
  Shared* shared;
  size_t map_bytes;
  uint32_t sense;  // this rank's barrier sense
};

namespace {

std::atomic<uint64_t> g_id_sequence{0};

void LogCollective(const char* what, size_t count) {
  const char* path = std::getenv("STANDIN_GCU_CALL_LOG");
  if (path == nullptr || *path == '\0') return;
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&mu);
  if (FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "xccl_%s [%zu]\n", what, count);
    std::fclose(f);
  }
  pthread_mutex_unlock(&mu);
}

double TimeoutSeconds() {
  const char* v = std::getenv("STANDIN_GCU_XCCL_TIMEOUT_S");
  double t = v != nullptr && *v != '\0' ? std::atof(v) : 0.0;
  return t > 0 ? t : 300.0;
}

double Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

char* Slot(C_CCLComm c, size_t rank) { return reinterpret_cast<char*>(c->shared) + kHeaderBytes + rank * kSlotBytes; }

// A peer (pid recorded at attach) that no longer exists; -1 when all are alive (or not attached yet).
int DeadPeer(C_CCLComm c) {
  for (size_t r = 0; r < c->nranks; ++r) {
    int32_t pid = c->shared->pid[r];
    if (r != c->rank && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) return static_cast<int>(r);
  }
  return -1;
}

// Waits until done(c) holds. Fails (and marks the communicator failed for every rank) on the
// timeout, a dead peer, or a peer that failed before. Yields first, then sleeps 50 us per poll.
template <typename Done>
C_Status Wait(C_CCLComm c, const char* what, Done done) {
  const double start = Now(), timeout = TimeoutSeconds();
  double next_check = start + 0.5;
  for (unsigned polls = 0; !done(c); ++polls) {
    const char* why = nullptr;
    int dead = -1;
    if (c->shared->failed.load()) {
      why = "a peer rank failed before";
    } else if (Now() > next_check) {
      next_check = Now() + 0.5;
      if ((dead = DeadPeer(c)) >= 0) why = "a peer rank's process is gone";
      else if (Now() - start > timeout) why = "timed out (STANDIN_GCU_XCCL_TIMEOUT_S)";
    }
    if (why != nullptr) {
      c->shared->failed.store(1);
      std::fprintf(stderr, "standin_gcu xccl: rank %zu of %zu, %s on communicator %s: %s (dead rank %d) after %.1f s\n",
                   c->rank, c->nranks, what, c->name, why, dead, Now() - start);
      return C_FAILED;
    }
    if (polls < 200) {
      sched_yield();
    } else {
      timespec ts{0, 50 * 1000};
      nanosleep(&ts, nullptr);
    }
  }
  return C_SUCCESS;
}

// Sense-reversing barrier over the ranks of `c`: the last rank to arrive resets the count, then
// flips the shared sense that the others wait for (seq_cst atomics: slot writes before the barrier
// are visible to every rank after it).
C_Status Barrier(C_CCLComm c, const char* what) {
  c->sense ^= 1u;
  const uint32_t want = c->sense;
  if (c->shared->count.fetch_add(1) + 1 == c->nranks) {
    c->shared->count.store(0);
    c->shared->sense.store(want);
    return C_SUCCESS;
  }
  return Wait(c, what, [want](C_CCLComm x) { return x->shared->sense.load() == want; });
}

// -- element types and reductions ---------------------------------------------------------------
size_t ElementBytes(C_DataType t) {
  switch (t) {
    case BOOL: case UINT8: case INT8: return 1;
    case UINT16: case INT16: case FLOAT16: case BFLOAT16: return 2;
    case UINT32: case INT32: case FLOAT32: return 4;
    case UINT64: case INT64: case FLOAT64: case COMPLEX64: return 8;
    case COMPLEX128: return 16;
    default: return 0;
  }
}

float Bf16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

template <typename T>
T Combine(T a, T b, C_CCLReduceOp op) {
  switch (op) {
    case MAX: return a > b ? a : b;
    case MIN: return a < b ? a : b;
    case PRODUCT: return static_cast<T>(a * b);
    default: return static_cast<T>(a + b);  // SUM, AVG (divided at the end)
  }
}

// out[i] = op over ranks r of src_r[i], i < n, with src_r = Slot(c, r) + offset; T the element
// type, A the type the arithmetic runs in (float for the 16-bit floats).
template <typename T, typename A, A (*Load)(T), T (*Store)(A)>
void ReduceSlots(C_CCLComm c, size_t offset, size_t n, C_CCLReduceOp op, void* out) {
  for (size_t i = 0; i < n; ++i) {
    A acc = Load(reinterpret_cast<const T*>(Slot(c, 0) + offset)[i]);
    for (size_t r = 1; r < c->nranks; ++r) acc = Combine(acc, Load(reinterpret_cast<const T*>(Slot(c, r) + offset)[i]), op);
    if (op == AVG) acc = static_cast<A>(acc / static_cast<A>(c->nranks));
    static_cast<T*>(out)[i] = Store(acc);
  }
}

template <typename T>
T Same(T x) { return x; }
float HalfToFloat(_Float16 h) { return static_cast<float>(h); }
_Float16 FloatToHalf(float f) { return static_cast<_Float16>(f); }

bool Reducible(C_DataType t) {
  return t == FLOAT32 || t == FLOAT64 || t == FLOAT16 || t == BFLOAT16 || t == INT8 || t == INT16 || t == INT32 ||
         t == INT64 || t == UINT8;
}

// False for a dtype the reductions do not support (bool, unsigned 16-64 bit, complex): callers
// check Reducible first, so that no rank leaves a collective its peers are still in.
bool Reduce(C_CCLComm c, C_DataType t, size_t offset, size_t n, C_CCLReduceOp op, void* out) {
  switch (t) {
    case FLOAT32: ReduceSlots<float, float, Same<float>, Same<float>>(c, offset, n, op, out); return true;
    case FLOAT64: ReduceSlots<double, double, Same<double>, Same<double>>(c, offset, n, op, out); return true;
    case FLOAT16: ReduceSlots<_Float16, float, HalfToFloat, FloatToHalf>(c, offset, n, op, out); return true;
    case BFLOAT16: ReduceSlots<uint16_t, float, Bf16ToFloat, FloatToBf16>(c, offset, n, op, out); return true;
    case INT8: ReduceSlots<int8_t, int8_t, Same<int8_t>, Same<int8_t>>(c, offset, n, op, out); return true;
    case INT16: ReduceSlots<int16_t, int16_t, Same<int16_t>, Same<int16_t>>(c, offset, n, op, out); return true;
    case INT32: ReduceSlots<int32_t, int32_t, Same<int32_t>, Same<int32_t>>(c, offset, n, op, out); return true;
    case INT64: ReduceSlots<int64_t, int64_t, Same<int64_t>, Same<int64_t>>(c, offset, n, op, out); return true;
    case UINT8: ReduceSlots<uint8_t, uint8_t, Same<uint8_t>, Same<uint8_t>>(c, offset, n, op, out); return true;
    default: return false;
  }
}

C_Status Unsupported(C_CCLComm c, const char* what, C_DataType t) {
  std::fprintf(stderr, "standin_gcu xccl: %s on rank %zu: data type %d is not supported by the stand-in\n", what,
               c->rank, static_cast<int>(t));
  return C_ERROR;
}

bool Usable(C_CCLComm c, const char* what) {
  if (c == nullptr || c->shared == nullptr) {
    std::fprintf(stderr, "standin_gcu xccl: %s on a null communicator\n", what);
    return false;
  }
  if (c->shared->failed.load()) {
    std::fprintf(stderr, "standin_gcu xccl: %s on failed communicator %s (rank %zu)\n", what, c->name, c->rank);
    return false;
  }
  return true;
}

// -- communicators ------------------------------------------------------------------------------
C_Status GetUniqueIdSize(size_t* size) {
  *size = kIdBytes;
  return C_SUCCESS;
}

C_Status GetUniqueId(C_CCLRootId* id) {
  if (id == nullptr || id->data == nullptr || id->sz < kIdBytes) return C_ERROR;
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  std::memset(id->data, 0, id->sz);
  std::snprintf(static_cast<char*>(id->data), kIdBytes, "%s%ld.%llu.%lld%09ld", kPrefix, static_cast<long>(getpid()),
                static_cast<unsigned long long>(g_id_sequence.fetch_add(1)), static_cast<long long>(ts.tv_sec),
                ts.tv_nsec);
  LogCollective("get_unique_id", kIdBytes);
  return C_SUCCESS;
}

// Opens (or creates) and maps the segment named `name`, sized for `nranks` slots; nullptr on error.
Shared* MapSegment(const char* name, size_t nranks, size_t* bytes) {
  *bytes = kHeaderBytes + nranks * kSlotBytes;
  int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
  if (fd < 0) return nullptr;
  struct stat st;
  // Every rank sizes it the same; growing a fresh (zero-length) segment fills it with zeros,
  // and a segment a peer has already sized is left as it is.
  if (fstat(fd, &st) != 0 || (static_cast<size_t>(st.st_size) < *bytes && ftruncate(fd, static_cast<off_t>(*bytes)) != 0)) {
    close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<Shared*>(p);
}

C_Status CommInitRank(size_t nranks, C_CCLRootId* id, size_t rank, C_CCLComm* out) {
  *out = nullptr;
  const char* name = id != nullptr ? static_cast<const char*>(id->data) : nullptr;
  if (name == nullptr || id->sz != kIdBytes || memchr(name, '\0', kIdBytes) == nullptr ||
      std::strncmp(name, kPrefix, sizeof(kPrefix) - 1) != 0 || nranks == 0 || nranks > kMaxRanks || rank >= nranks) {
    std::fprintf(stderr, "standin_gcu xccl: comm_init_rank: bad arguments (rank %zu of %zu, id not a stand-in id)\n",
                 rank, nranks);
    return C_ERROR;
  }
  auto* c = new C_CCLComm_st{};
  std::snprintf(c->name, kIdBytes, "%s", name);
  c->rank = rank;
  c->nranks = nranks;
  c->shared = MapSegment(name, nranks, &c->map_bytes);
  if (c->shared == nullptr) {
    std::fprintf(stderr, "standin_gcu xccl: cannot map %s: %s\n", name, std::strerror(errno));
    delete c;
    return C_FAILED;
  }
  c->shared->pid[rank] = static_cast<int32_t>(getpid());
  c->shared->attached.fetch_add(1);
  C_Status s = Wait(c, "comm_init_rank", [](C_CCLComm x) { return x->shared->attached.load() >= x->nranks; });
  shm_unlink(name);  // every rank has it mapped (or we gave up): the name is no longer needed
  LogCollective("comm_init_rank", nranks);
  if (s != C_SUCCESS) {
    munmap(c->shared, c->map_bytes);
    delete c;
    return s;
  }
  *out = c;
  return C_SUCCESS;
}

C_Status DestroyComm(C_CCLComm c) {
  if (c == nullptr) return C_SUCCESS;
  LogCollective("destroy_comm", c->nranks);
  if (c->shared != nullptr) munmap(c->shared, c->map_bytes);
  delete c;
  return C_SUCCESS;
}

C_Status GetCommName(C_CCLComm c, char* name) {
  if (c == nullptr || name == nullptr) return C_ERROR;
  LogCollective("get_comm_name", c->nranks);
  std::strcpy(name, c->name);  // < kIdBytes bytes; Paddle passes a buffer of at least 128
  return C_SUCCESS;
}

// -- collectives --------------------------------------------------------------------------------
C_Status AllReduce(void* send, void* recv, size_t count, C_DataType t, C_CCLReduceOp op, C_CCLComm c, C_Stream) {
  const size_t esize = ElementBytes(t);
  if (!Usable(c, "all_reduce")) return C_FAILED;
  if (!Reducible(t)) return Unsupported(c, "all_reduce", t);
  LogCollective("all_reduce", count);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(count - done, kSlotBytes / esize);
    std::memcpy(Slot(c, c->rank), static_cast<const char*>(send) + done * esize, n * esize);
    if (Barrier(c, "all_reduce") != C_SUCCESS) return C_FAILED;
    if (!Reduce(c, t, 0, n, op, static_cast<char*>(recv) + done * esize)) return Unsupported(c, "all_reduce", t);
    if (Barrier(c, "all_reduce") != C_SUCCESS) return C_FAILED;
    done += n;
  }
  return C_SUCCESS;
}

C_Status ReduceToRoot(void* send, void* recv, size_t count, C_DataType t, C_CCLReduceOp op, size_t root, C_CCLComm c,
                      C_Stream) {
  const size_t esize = ElementBytes(t);
  if (!Usable(c, "reduce")) return C_FAILED;
  if (!Reducible(t)) return Unsupported(c, "reduce", t);
  LogCollective("reduce", count);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(count - done, kSlotBytes / esize);
    std::memcpy(Slot(c, c->rank), static_cast<const char*>(send) + done * esize, n * esize);
    if (Barrier(c, "reduce") != C_SUCCESS) return C_FAILED;
    if (c->rank == root && !Reduce(c, t, 0, n, op, static_cast<char*>(recv) + done * esize)) {
      return Unsupported(c, "reduce", t);
    }
    if (Barrier(c, "reduce") != C_SUCCESS) return C_FAILED;
    done += n;
  }
  return C_SUCCESS;
}

C_Status Broadcast(void* buf, size_t count, C_DataType t, size_t root, C_CCLComm c, C_Stream) {
  const size_t esize = ElementBytes(t);
  if (!Usable(c, "broadcast")) return C_FAILED;
  if (esize == 0 || root >= c->nranks) return Unsupported(c, "broadcast", t);
  LogCollective("broadcast", count);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(count - done, kSlotBytes / esize);
    char* chunk = static_cast<char*>(buf) + done * esize;
    if (c->rank == root) std::memcpy(Slot(c, root), chunk, n * esize);
    if (Barrier(c, "broadcast") != C_SUCCESS) return C_FAILED;
    if (c->rank != root) std::memcpy(chunk, Slot(c, root), n * esize);
    if (Barrier(c, "broadcast") != C_SUCCESS) return C_FAILED;
    done += n;
  }
  return C_SUCCESS;
}

// recv[r * count + i] = rank r's send[i].
C_Status AllGather(void* send, void* recv, size_t count, C_DataType t, C_CCLComm c, C_Stream) {
  const size_t esize = ElementBytes(t);
  if (!Usable(c, "all_gather")) return C_FAILED;
  if (esize == 0) return Unsupported(c, "all_gather", t);
  LogCollective("all_gather", count);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(count - done, kSlotBytes / esize);
    std::memcpy(Slot(c, c->rank), static_cast<const char*>(send) + done * esize, n * esize);
    if (Barrier(c, "all_gather") != C_SUCCESS) return C_FAILED;
    for (size_t r = 0; r < c->nranks; ++r) {
      std::memcpy(static_cast<char*>(recv) + (r * count + done) * esize, Slot(c, r), n * esize);
    }
    if (Barrier(c, "all_gather") != C_SUCCESS) return C_FAILED;
    done += n;
  }
  return C_SUCCESS;
}

// recv[i] = op over ranks s of rank s's send[rank * count + i]. Each chunk of the output puts, in
// every rank's slot, that rank's pieces for all destinations (nranks * n elements).
C_Status ReduceScatter(void* send, void* recv, size_t count, C_DataType t, C_CCLReduceOp op, C_CCLComm c, C_Stream) {
  const size_t esize = ElementBytes(t);
  if (!Usable(c, "reduce_scatter")) return C_FAILED;
  if (!Reducible(t)) return Unsupported(c, "reduce_scatter", t);
  LogCollective("reduce_scatter", count);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(count - done, kSlotBytes / esize / c->nranks);
    for (size_t d = 0; d < c->nranks; ++d) {
      std::memcpy(Slot(c, c->rank) + d * n * esize, static_cast<const char*>(send) + (d * count + done) * esize,
                  n * esize);
    }
    if (Barrier(c, "reduce_scatter") != C_SUCCESS) return C_FAILED;
    if (!Reduce(c, t, c->rank * n * esize, n, op, static_cast<char*>(recv) + done * esize)) {
      return Unsupported(c, "reduce_scatter", t);
    }
    if (Barrier(c, "reduce_scatter") != C_SUCCESS) return C_FAILED;
    done += n;
  }
  return C_SUCCESS;
}

C_Status GroupNoop() { return C_SUCCESS; }

}  // namespace

// Called by InitPlugin (standin_gcu.cc).
void StandinRegisterCollectives(C_DeviceInterface* f) {
  f->xccl_get_unique_id_size = GetUniqueIdSize;
  f->xccl_get_unique_id = GetUniqueId;
  f->xccl_comm_init_rank = CommInitRank;
  f->xccl_destroy_comm = DestroyComm;
  f->xccl_get_comm_name = GetCommName;
  f->xccl_all_reduce = AllReduce;
  f->xccl_broadcast = Broadcast;
  f->xccl_reduce = ReduceToRoot;
  f->xccl_all_gather = AllGather;
  f->xccl_reduce_scatter = ReduceScatter;
  f->xccl_group_start = GroupNoop;
  f->xccl_group_end = GroupNoop;
}
