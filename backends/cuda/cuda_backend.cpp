// CudaBackend on the driver API. libcuda.so.1 is opened with dlopen and every
// entry point taken through cuGetProcAddress, so nothing links against the
// driver: the same binaries start in CI, where there is none.
#include "metrale/cuda/cuda_backend.hpp"

#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <source_location>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "fatbins.hpp"
#include "metrale/error.hpp"

namespace metrale {

namespace {

// Every driver function this backend calls, resolved once.
#define METRALE_CU_FUNCTIONS(X)                                                                                      \
  X(cuInit)                                                                                                          \
  X(cuDriverGetVersion)                                                                                              \
  X(cuDeviceGetCount)                                                                                                \
  X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) \
      X(cuCtxSetCurrent) X(cuCtxSynchronize) X(cuMemAlloc) X(cuMemFree) X(cuMemcpyHtoD) X(cuMemcpyDtoH)              \
          X(cuMemcpyDtoD) X(cuMemsetD8) X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)                 \
              X(cuFuncGetParamInfo) X(cuLaunchKernel) X(cuLaunchKernelEx) X(cuOccupancyMaxActiveClusters)            \
                  X(cuStreamSynchronize) X(cuGetErrorName) X(cuGetErrorString) X(cuEventCreate) X(cuEventRecord)     \
                      X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy) X(cuFuncSetAttribute)            \
                          X(cuMemHostAlloc) X(cuMemHostGetDevicePointer) X(cuMemFreeHost) X(cuStreamWaitValue32)

struct Driver {
#define METRALE_CU_MEMBER(f) decltype(&::f) f = nullptr;
  METRALE_CU_FUNCTIONS(METRALE_CU_MEMBER)
#undef METRALE_CU_MEMBER
  std::string error;  // why loading failed
};

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      // (dlerror names the library first: said once)
      std::string why = dlerror();
      if (why.starts_with("libcuda.so.1: ")) why.erase(0, 14);
      r.error = "cannot load libcuda.so.1: " + why;
      return r;
    }
    using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
    auto get_proc = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
    if (get_proc == nullptr) {
      r.error = "libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12)";
      return r;
    }
#define METRALE_CU_LOAD(f)                                                                                    \
  if (r.error.empty()) {                                                                                      \
    void* p = nullptr;                                                                                        \
    CUdriverProcAddressQueryResult status{};                                                                  \
    if (get_proc(#f, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || p == nullptr) \
      r.error = "the driver does not provide " #f;                                                            \
    r.f = reinterpret_cast<decltype(r.f)>(p);                                                                 \
  }
    METRALE_CU_FUNCTIONS(METRALE_CU_LOAD)
#undef METRALE_CU_LOAD
    return r;
  }();
  return d;
}

const Driver& api() {
  const Driver& d = driver();
  if (!d.error.empty()) fail(Errc::unsupported, "backend cuda: {}", d.error);
  return d;
}

Errc code_of(CUresult r) {
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return Errc::out_of_memory;
    case CUDA_ERROR_NOT_FOUND:
      return Errc::not_found;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_NOT_SUPPORTED:  // e.g. a driver without stream memory operations (time_ms held)
      return Errc::unsupported;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
    case CUDA_ERROR_INVALID_HANDLE:
      return Errc::launch_failed;
    default:
      return Errc::device_fault;
  }
}

// The one error path: a failed driver call becomes the project error with the call, the driver's
// name and description of the result, and where it was made (STYLE §6).
void check(CUresult r, const char* call, std::source_location where = std::source_location::current()) {
  if (r == CUDA_SUCCESS) return;
  const char* name = "?";
  const char* text = "?";
  if (const Driver& d = driver(); d.error.empty()) {
    d.cuGetErrorName(r, &name);
    d.cuGetErrorString(r, &text);
  }
  throw Error(code_of(r),
              fmt::format("{} failed: {} ({}) at {}:{}", call, name, text, where.file_name(), where.line()));
}

#define METRALE_CU(call) check(api().call, #call)

struct Kernel {
  std::string module, entry;
  CUfunction function;
  std::vector<std::size_t> param_sizes;  // from the image
  std::uint32_t shared_limit = 48 * 1024;  // dynamic shared memory allowed without opting in
};

// METRALE_CUDA_FATBIN_DIR/<module>.fatbin when the variable names a folder and that file exists
// (else nothing: the built-in image), checked to be a whole fatbin — the driver reads an image
// by its own header, so a truncated one would be read past its end. Errors
// (`invalid_argument`): the variable names no folder; the file is not a regular file, cannot be
// read, or is not a fatbin of its size (nvcc -fatbin).
std::vector<unsigned char> fatbin_override(std::string_view name) {
  const char* dir = std::getenv("METRALE_CUDA_FATBIN_DIR");
  if (dir == nullptr || *dir == '\0') return {};
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    fail(Errc::invalid_argument, "backend cuda: METRALE_CUDA_FATBIN_DIR {} is not a folder", dir);
  const auto path = std::filesystem::path(dir) / (std::string(name) + ".fatbin");
  if (!std::filesystem::exists(path, ec)) {
    spdlog::debug("backend cuda: module {} built in (no {})", name, path.string());
    return {};
  }
  if (!std::filesystem::is_regular_file(path, ec))
    fail(Errc::invalid_argument, "backend cuda: {} is not a regular file", path.string());
  std::vector<unsigned char> file(std::filesystem::file_size(path, ec));
  std::ifstream in{path, std::ios::binary};
  if (ec || !in.read(reinterpret_cast<char*>(file.data()), static_cast<std::streamsize>(file.size())))
    fail(Errc::invalid_argument, "backend cuda: cannot read {}", path.string());
  // The fatbin header: magic 0xBA55ED50, version (u16), header size (u16), payload size (u64).
  constexpr std::uint32_t kMagic = 0xBA55ED50u;
  std::uint32_t magic = 0;
  std::uint16_t header = 0;
  std::uint64_t payload = 0;
  if (file.size() >= 16) {
    std::memcpy(&magic, file.data(), 4);
    std::memcpy(&header, file.data() + 6, 2);
    std::memcpy(&payload, file.data() + 8, 8);
  }
  if (magic != kMagic || header < 16 || payload > file.size() || header + payload > file.size())
    fail(Errc::invalid_argument, "backend cuda: {} ({} bytes) is not a whole fatbin (nvcc -fatbin)", path.string(),
         file.size());
  spdlog::info("backend cuda: module {} from {} (METRALE_CUDA_FATBIN_DIR)", name, path.string());
  return file;
}

// The placement policy of clustered launches and of the occupancy query that sizes their plans
// (a preference the driver may pass over): METRALE_CUDA_CLUSTER_POLICY balance (unset or empty:
// CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING, "allow the hardware to load-balance the blocks in
// a cluster to the SMs"), spread (CU_CLUSTER_SCHEDULING_POLICY_SPREAD) or default (the driver's
// own, which launches had before the setting). Why balance by default: docs/performance.md,
// "Thirty-seventh session" (on an H100, never slower beyond the runs' spread, and more of the
// 16-head entry's 3- and 4-block clusters at once). Errors: `invalid_argument` naming any other
// value.
std::pair<CUclusterSchedulingPolicy, std::string> cluster_policy_from_env() {
  const char* env = std::getenv("METRALE_CUDA_CLUSTER_POLICY");
  const std::string name = env != nullptr && *env != '\0' ? env : "balance";
  if (name == "balance") return {CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING, name};
  if (name == "spread") return {CU_CLUSTER_SCHEDULING_POLICY_SPREAD, name};
  if (name == "default") return {CU_CLUSTER_SCHEDULING_POLICY_DEFAULT, name};
  fail(Errc::invalid_argument,
       "backend cuda: METRALE_CUDA_CLUSTER_POLICY '{}' is not balance, spread or default (unset or empty: balance)",
       printable(name));
}

// A stream held, from the constructor on, by a wait (cuStreamWaitValue32) on a word of mapped
// host memory, until open() writes the value it waits for: whatever is queued on the stream
// meanwhile starts at once when it opens, with no traffic in memory while it waits (nvbench's
// blocking kernel does the same with a spinning kernel). A watchdog opens it after kTimeout, so a
// caller that waits on the held stream, or fills its queue, is held up that long and no longer.
class StreamHold {
 public:
  static constexpr auto kTimeout = std::chrono::seconds(2);

  StreamHold(std::uint32_t* word, CUdeviceptr device_word, CUstream stream)
      : word_(word), value_(std::atomic_ref(*word).load() + 1) {
    // The watchdog first: a thread that cannot start throws before the stream is held.
    watchdog_ = std::jthread([this](std::stop_token stop) {
      std::mutex m;
      std::condition_variable_any cv;
      std::unique_lock lock(m);
      cv.wait_for(lock, stop, kTimeout, [] { return false; });  // until open() or kTimeout
      if (!stop.stop_requested()) {
        timed_out_ = true;
        write();
      }
    });
    // (If queueing the wait throws, the watchdog is stopped and joined as a member, unwritten.)
    METRALE_CU(cuStreamWaitValue32(stream, device_word, value_, CU_STREAM_WAIT_VALUE_GEQ));
  }
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;
  ~StreamHold() { open(); }

  /// Let the stream go on; false when the watchdog had let it go first.
  bool open() {
    if (watchdog_.joinable()) {
      watchdog_.request_stop();
      watchdog_.join();
    }
    write();
    return !timed_out_;
  }

 private:
  void write() { std::atomic_ref(*word_).store(value_, std::memory_order_release); }

  std::uint32_t* word_;
  std::uint32_t value_;  // the word's value plus one: the wait is for the word ≥ it
  std::atomic<bool> timed_out_ = false;
  std::jthread watchdog_;
};

}  // namespace

struct CudaBackend::Impl {
  CUdevice device{};
  CUcontext context{};
  std::uint32_t compute_capability = 0;  // major·10 + minor
  std::pair<CUclusterSchedulingPolicy, std::string> cluster_policy;  // cluster_policy_from_env()
  std::mutex mutex;
  std::vector<std::pair<std::string, CUmodule>> modules;
  std::deque<Kernel> kernels;          // handle id = index + 1; a deque: appending moves no kernel
  std::uint32_t* hold_word = nullptr;  // time_ms's StreamHold word, mapped host memory (made at first use)
  CUdeviceptr hold_device_word{};

  // The modules, the hold word and the primary context go back here, also when the backend's
  // constructor throws after taking the context (a constructor that throws runs no destructor of
  // its own).
  ~Impl() {
    if (context == nullptr) return;
    const Driver& d = driver();
    d.cuCtxSetCurrent(context);
    for (const auto& [name, m] : modules) d.cuModuleUnload(m);
    if (hold_word != nullptr) d.cuMemFreeHost(hold_word);
    d.cuDevicePrimaryCtxRelease(device);
  }

  // The kernel of `handle`, its dynamic shared memory limit raised to `shared_bytes` first (above
  // 48 KiB a kernel must opt in), under the mutex that kernel() appends under. Its function and
  // parameter sizes never change after, so callers read them without it. Errors:
  // `launch_failed` for a handle this backend did not give.
  const Kernel& kernel(KernelHandle handle, std::uint32_t shared_bytes) {
    std::lock_guard lock(mutex);
    if (handle.id == 0 || handle.id > kernels.size())
      fail(Errc::launch_failed, "backend cuda: unknown kernel handle {}", handle.id);
    Kernel& k = kernels[handle.id - 1];
    if (shared_bytes > k.shared_limit) {
      METRALE_CU(cuFuncSetAttribute(k.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    static_cast<int>(shared_bytes)));
      k.shared_limit = shared_bytes;
    }
    return k;
  }

  // Makes the hold word at first use.
  void make_hold_word() {
    if (hold_word == nullptr) {
      void* p = nullptr;
      METRALE_CU(cuMemHostAlloc(&p, sizeof(std::uint32_t), CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
      *static_cast<std::uint32_t*>(p) = 0;
      if (const CUresult r = api().cuMemHostGetDevicePointer(&hold_device_word, p, 0); r != CUDA_SUCCESS) {
        api().cuMemFreeHost(p);
        check(r, "cuMemHostGetDevicePointer");
      }
      hold_word = static_cast<std::uint32_t*>(p);
    }
  }

  CUmodule module(std::string_view name) {
    for (const auto& [n, m] : modules)
      if (n == name) return m;
    const std::vector<unsigned char> file = fatbin_override(name);
    const auto image = file.empty() ? cuda_fatbin(name) : std::span<const unsigned char>(file);
    if (image.empty()) fail(Errc::not_found, "backend cuda: no module {} in this build", name);
    CUmodule m{};
    METRALE_CU(cuModuleLoadData(&m, image.data()));
    modules.emplace_back(std::string(name), m);
    return m;
  }
};

bool CudaBackend::available() { return unavailable_reason().empty(); }

std::string CudaBackend::unavailable_reason() {
  const Driver& d = driver();
  if (!d.error.empty()) return d.error;
  if (const CUresult r = d.cuInit(0); r != CUDA_SUCCESS) {
    const char* name = "?";
    d.cuGetErrorName(r, &name);
    return fmt::format("cuInit failed: {}", name);
  }
  int count = 0;
  if (d.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) return "no CUDA device";
  return "";
}

CudaBackend::CudaBackend(int ordinal) : impl_(std::make_unique<Impl>()) {
  if (const std::string why = unavailable_reason(); !why.empty()) fail(Errc::unsupported, "backend cuda: {}", why);
  impl_->cluster_policy = cluster_policy_from_env();
  METRALE_CU(cuDeviceGet(&impl_->device, ordinal));
  METRALE_CU(cuDevicePrimaryCtxRetain(&impl_->context, impl_->device));
  METRALE_CU(cuCtxSetCurrent(impl_->context));
  impl_->compute_capability = compute_capability();
}

CudaBackend::~CudaBackend() = default;  // Impl gives the modules and the context back

DevicePtr CudaBackend::do_alloc(std::size_t bytes, std::source_location) {
  if (bytes == 0) fail(Errc::invalid_argument, "alloc of 0 bytes");
  CUdeviceptr p{};
  METRALE_CU(cuMemAlloc(&p, bytes));
  return DevicePtr{p};
}

void CudaBackend::free(DevicePtr ptr) {
  if (ptr) METRALE_CU(cuMemFree(ptr.addr));
}

void CudaBackend::copy_h2d(std::span<const std::byte> src, DevicePtr dst) {
  if (!src.empty()) METRALE_CU(cuMemcpyHtoD(dst.addr, src.data(), src.size()));
}

void CudaBackend::copy_d2h(DevicePtr src, std::span<std::byte> dst) {
  if (!dst.empty()) METRALE_CU(cuMemcpyDtoH(dst.data(), src.addr, dst.size()));
}

void CudaBackend::copy_d2d(DevicePtr src, DevicePtr dst, std::size_t bytes) {
  if (bytes != 0) METRALE_CU(cuMemcpyDtoD(dst.addr, src.addr, bytes));
}

void CudaBackend::memset(DevicePtr dst, std::uint8_t value, std::size_t bytes) {
  if (bytes != 0) METRALE_CU(cuMemsetD8(dst.addr, value, bytes));
}

KernelHandle CudaBackend::kernel(std::string_view module, std::string_view entry) {
  std::lock_guard lock(impl_->mutex);
  for (std::size_t i = 0; i < impl_->kernels.size(); ++i)
    if (impl_->kernels[i].module == module && impl_->kernels[i].entry == entry) return KernelHandle{i + 1};
  const CUmodule m = with_context(fmt::format("kernel {}.{}", module, entry), [&] { return impl_->module(module); });
  Kernel k{std::string(module), std::string(entry), nullptr, {}};
  const std::string entry_z(entry);
  if (const CUresult r = api().cuModuleGetFunction(&k.function, m, entry_z.c_str()); r != CUDA_SUCCESS)
    fail(Errc::not_found, "backend cuda: no kernel {} in module {}", entry, module);
  // The image's own parameter list: sizes in declaration order, until the index runs out.
  for (std::size_t i = 0;; ++i) {
    std::size_t offset = 0, size = 0;
    if (api().cuFuncGetParamInfo(k.function, i, &offset, &size) != CUDA_SUCCESS) break;
    k.param_sizes.push_back(size);
  }
  impl_->kernels.push_back(std::move(k));
  return KernelHandle{impl_->kernels.size()};
}

std::string CudaBackend::kernel_name(KernelHandle kernel) const {
  std::lock_guard lock(impl_->mutex);
  if (kernel.id == 0 || kernel.id > impl_->kernels.size()) return fmt::format("kernel #{}", kernel.id);
  const Kernel& k = impl_->kernels[kernel.id - 1];
  return k.module + "." + k.entry;
}

void CudaBackend::do_launch(KernelHandle kernel, Dim3 grid, Dim3 block, std::span<const KernelArg> args, Stream stream,
                            std::uint32_t shared_bytes, bool early_start, Dim3 cluster) {
  const Kernel& k = impl_->kernel(kernel, shared_bytes);
  // A launcher that drifted from its kernel fails here, before the driver reads garbage.
  if (args.size() != k.param_sizes.size())
    fail(Errc::launch_failed, "{} arguments but {} takes {}", args.size(), k.entry, k.param_sizes.size());
  std::vector<std::uint64_t> storage(args.size());
  std::vector<void*> params(args.size());
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (arg_size(args[i].kind) != k.param_sizes[i])
      fail(Errc::launch_failed, "argument {} is {} ({} bytes) but {} takes {} bytes there", i, to_string(args[i].kind),
           arg_size(args[i].kind), k.entry, k.param_sizes[i]);
    storage[i] = args[i].bits;  // little-endian: a 4-byte argument is the low half
    params[i] = &storage[i];
  }
  // Early only where the device has it and every kernel image waits for it (griddepcontrol.wait
  // exists from sm_90; a build with a lower target has images without it).
  const bool early = early_start && impl_->compute_capability >= 90 && METRALE_CUDA_MIN_ARCH >= 90;
  const bool clustered = cluster.count() > 1;  // GpuBackend::launch checked the shape
  if (!early && !clustered) {
    METRALE_CU(cuLaunchKernel(k.function, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes,
                              reinterpret_cast<CUstream>(stream), params.data(), nullptr));
    return;
  }
  CUlaunchAttribute attrs[3]{};
  unsigned count = 0;
  if (early) {
    attrs[count].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[count++].value.programmaticStreamSerializationAllowed = 1;
  }
  if (clustered) {
    attrs[count].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[count].value.clusterDim.x = cluster.x, attrs[count].value.clusterDim.y = cluster.y;
    attrs[count++].value.clusterDim.z = cluster.z;
    attrs[count].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[count++].value.clusterSchedulingPolicyPreference = impl_->cluster_policy.first;
  }
  CUlaunchConfig config{};
  config.gridDimX = grid.x, config.gridDimY = grid.y, config.gridDimZ = grid.z;
  config.blockDimX = block.x, config.blockDimY = block.y, config.blockDimZ = block.z;
  config.sharedMemBytes = shared_bytes, config.hStream = reinterpret_cast<CUstream>(stream);
  config.attrs = attrs, config.numAttrs = count;
  METRALE_CU(cuLaunchKernelEx(&config, k.function, params.data(), nullptr));
}

std::uint32_t CudaBackend::max_active_clusters(KernelHandle kernel, Dim3 block, std::uint32_t shared_bytes,
                                               std::uint32_t cluster_size) const {
  if (cluster_size == 0 || cluster_size > 8 || impl_->compute_capability < 90) return 0;
  const Kernel& k = impl_->kernel(kernel, shared_bytes);  // as do_launch: the limit raised first
  CUlaunchAttribute attrs[2]{};
  attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attrs[0].value.clusterDim.x = cluster_size, attrs[0].value.clusterDim.y = 1, attrs[0].value.clusterDim.z = 1;
  attrs[1].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
  attrs[1].value.clusterSchedulingPolicyPreference = impl_->cluster_policy.first;
  CUlaunchConfig config{};
  config.gridDimX = cluster_size, config.gridDimY = 1, config.gridDimZ = 1;
  config.blockDimX = block.x, config.blockDimY = block.y, config.blockDimZ = block.z;
  config.sharedMemBytes = shared_bytes, config.attrs = attrs, config.numAttrs = 2;
  int clusters = 0;
  METRALE_CU(cuOccupancyMaxActiveClusters(&clusters, k.function, &config));
  return static_cast<std::uint32_t>(std::max(clusters, 0));
}

void CudaBackend::synchronize(Stream stream) { METRALE_CU(cuStreamSynchronize(reinterpret_cast<CUstream>(stream))); }

const std::string& CudaBackend::cluster_policy() const { return impl_->cluster_policy.second; }

std::string CudaBackend::cluster_policy_setting() { return cluster_policy_from_env().second; }

std::string CudaBackend::device_name() const {
  char name[256] = {};
  METRALE_CU(cuDeviceGetName(name, sizeof(name), impl_->device));
  return name;
}

std::uint32_t CudaBackend::compute_capability() const {
  int major = 0, minor = 0;
  METRALE_CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, impl_->device));
  METRALE_CU(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, impl_->device));
  return static_cast<std::uint32_t>(major * 10 + minor);
}

std::uint32_t CudaBackend::multiprocessor_count() const {
  int n = 0;
  METRALE_CU(cuDeviceGetAttribute(&n, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, impl_->device));
  return static_cast<std::uint32_t>(n);
}

std::uint32_t CudaBackend::max_shared_bytes_per_block() const {
  int n = 0;
  METRALE_CU(cuDeviceGetAttribute(&n, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, impl_->device));
  return static_cast<std::uint32_t>(n);
}

int CudaBackend::driver_version() const {
  int v = 0;
  METRALE_CU(cuDriverGetVersion(&v));
  return v;
}

int CudaBackend::toolkit_version() { return CUDA_VERSION; }

double CudaBackend::time_ms(const std::function<void()>& work, Stream stream, bool held) {
  const auto s = reinterpret_cast<CUstream>(stream);
  CUevent start{}, stop{};
  METRALE_CU(cuEventCreate(&start, CU_EVENT_DEFAULT));
  METRALE_CU(cuEventCreate(&stop, CU_EVENT_DEFAULT));
  float ms = 0;
  try {
    std::optional<StreamHold> hold;
    if (held) {
      impl_->make_hold_word();
      hold.emplace(impl_->hold_word, impl_->hold_device_word, s);
    }
    METRALE_CU(cuEventRecord(start, s));
    work();
    METRALE_CU(cuEventRecord(stop, s));
    const bool queued_in_time = !hold || hold->open();
    METRALE_CU(cuEventSynchronize(stop));
    if (!queued_in_time)
      fail(Errc::launch_failed,
           "backend cuda: the timed work did not queue within {} s of stream {:#x} being held (time_ms held): it "
           "waited on that stream, or filled its queue",
           std::chrono::duration_cast<std::chrono::seconds>(StreamHold::kTimeout).count(), stream);
    METRALE_CU(cuEventElapsedTime(&ms, start, stop));
  } catch (...) {
    api().cuEventDestroy(start);
    api().cuEventDestroy(stop);
    throw;
  }
  api().cuEventDestroy(start);
  api().cuEventDestroy(stop);
  return ms;
}

}  // namespace metrale
