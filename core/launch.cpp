#include "metrale/launch.hpp"

#include <algorithm>

#include "metrale/error.hpp"

namespace metrale {

KernelLaunch& KernelLaunch::push(KernelArg a) {
  if (count_ == kMaxArgs) {
    overflow_ = true;
  } else {
    args_[count_++] = a;
  }
  return *this;
}

void KernelLaunch::launch(Stream stream) {
  with_context(gpu_.kernel_name(kernel_), [&] {
    if (overflow_) fail(Errc::internal, "more than {} kernel arguments", kMaxArgs);
    gpu_.launch(kernel_, grid_, block_, std::span(args_.data(), count_), stream, shared_, early_start_, cluster_);
  });
}

std::uint32_t GpuBackend::max_active_clusters(KernelHandle /*kernel*/, Dim3 block, std::uint32_t shared_bytes,
                                              std::uint32_t cluster_size) const {
  if (cluster_size == 0 || cluster_size > 8 || compute_capability() < 90 || block.count() == 0) return 0;
  // An SM has about 1 KiB more than a block may take, and reserves 1 KiB per block.
  const std::uint64_t by_threads = 2048 / block.count(),
                      by_shared = (std::uint64_t{max_shared_bytes_per_block()} + 1024) / (std::uint64_t{shared_bytes} + 1024);
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(
      std::uint64_t{multiprocessor_count()} * std::min(by_threads, by_shared) / cluster_size, 0xFFFF'FFFF));
}

void GpuBackend::check_cluster(Dim3 grid, Dim3 cluster) const {
  if (cluster.x == 1 && cluster.y == 1 && cluster.z == 1) return;
  const auto shape = [](Dim3 d) { return fmt::format("({},{},{})", d.x, d.y, d.z); };
  if (cluster.x == 0 || cluster.y == 0 || cluster.z == 0 || cluster.x > 8 || cluster.y > 8 || cluster.z > 8 ||
      cluster.count() > 8)
    fail(Errc::launch_failed, "cluster {} is not 1 to 8 blocks", shape(cluster));
  if (grid.x % cluster.x != 0 || grid.y % cluster.y != 0 || grid.z % cluster.z != 0)
    fail(Errc::launch_failed, "cluster {} does not divide grid {}", shape(cluster), shape(grid));
  if (compute_capability() < 90)
    fail(Errc::launch_failed, "cluster {} needs sm_90 or later (the device is sm_{})", shape(cluster),
         compute_capability());
}

}  // namespace metrale
