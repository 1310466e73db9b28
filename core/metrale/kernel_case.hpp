// Kernel cases (SPEC §5): one launch as data — the kernel, its scalar
// arguments by declared name, the initial contents of its pointer arguments,
// and the expected contents of its outputs with a tolerance. A case is a
// safetensors file, so PyTorch or numpy can write one, the emulator's recorder
// writes one per launch, and the same file runs on the emulator and on hardware.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "metrale/backend.hpp"
#include "metrale/safetensors.hpp"

namespace metrale {

/// got passes against want when |got − want| ≤ abs + rel·|want|, or when both
/// are BF16 values at most `ulps` apart. All zero: exact.
struct Tolerance {
  double abs = 0, rel = 0;
  std::uint32_t ulps = 0;
};

struct KernelCase {
  std::string name;
  std::string module, entry;
  Dim3 grid{}, block{};  // as launched, when recorded; the launcher recomputes them
  /// Whether grid and block are a recorded launch's (the recorder's cases, files that carry
  /// both): run_kernel_case then refuses a launch of another shape, and to_safetensors writes
  /// them only then.
  bool shape_recorded = false;
  /// Every non-pointer field of the kernel's launcher by name: the kernel's
  /// scalar parameters and the launch-shape ones (num_heads, num_seqs).
  std::map<std::string, KernelArg> scalars;
  /// Initial device contents per pointer parameter; an absent one is null.
  std::map<std::string, Tensor> inputs;
  /// Pointer parameters that get another one's buffer (param → the input it aliases): one latent
  /// pool passed as both caches, v_cache → k_cache. Written as metadata `alias.<param>`.
  std::map<std::string, std::string> aliases;
  /// Expected contents of the outputs after the launch (any float dtype for
  /// float outputs: a float64 reference or another backend's result).
  std::map<std::string, Tensor> expected;
  std::map<std::string, Tolerance> tolerance;
  /// Between two backends running this case, where it must be looser than
  /// same_arithmetic_tolerance: kernels whose transcendental functions differ
  /// between the host's libm and CUDA's math library (rope at large positions).
  std::map<std::string, Tolerance> backend_tolerance;
};

/// The launcher's fields of a kernel, as a case names them.
struct LauncherFields {
  std::vector<std::pair<std::string, ArgKind>> scalars;
  std::vector<std::string> pointers;
};
/// Errors: `not_found` naming module and entry for a kernel without a launcher.
const LauncherFields& launcher_fields(std::string_view module, std::string_view entry);
/// Every (module, entry) that has a launcher.
std::vector<std::pair<std::string, std::string>> launchable_kernels();
/// Whether kernel (or launcher-level path) `entry` of `module` stores through its pointer
/// parameter `param`: an output (its port's Global of non-const T). A case's expectation must be
/// of one. False for a name that is not one of its pointer parameters. Errors: `not_found` for a
/// kernel without a launcher (launcher_fields).
bool kernel_writes(std::string_view module, std::string_view entry, std::string_view param);

/// Why `gpu` cannot run case `c` (it would fail to launch), or nothing when it can:
/// entry_unavailable (the module or a wgmma block), or the shared memory of an mla_fast split
/// block (split_shared_bytes of its rows_per_block and kv_cache_dim, loaded directly as a replay
/// loads) or of a split path's smallest block (split_fits) past
/// GpuBackend::max_shared_bytes_per_block. A shape the launcher refuses (rows_per_block not 16,
/// 32, 48 or 64; kv_cache_dim not a multiple of 64 up to 576) is not called unavailable: the
/// launch names it. `conform` and `case run` skip such a case with this note.
std::optional<std::string> case_unavailable(const GpuBackend& gpu, const KernelCase& c);

/// The case as a safetensors file: metadata kind=kernel, module, entry, grid,
/// block, each scalar by name and `alias.<param>` = its input's name; tensors
/// named after pointer parameters,
/// `expected.<param>`, `tolerance.<param>` and `backend_tolerance.<param>`
/// (F64 [abs, rel, ulps]).
SafeTensors to_safetensors(const KernelCase& c);
/// Errors: `invalid_argument` naming what is missing or malformed (not a
/// kernel case, a scalar that does not parse, a grid that is not exactly
/// "x,y,z" of u32, a launch-shape field with neither metadata nor grid or with
/// a metadata value its grid or block contradicts, a metadata key that is not
/// a scalar parameter, an input tensor whose dtype is not its parameter's or
/// that has no elements, an expectation of a dtype check_output cannot compare
/// or of another length than its output's buffer, a tolerance that is not F64
/// [abs ≥ 0, rel ≥ 0, ulps a whole number that fits u32], or that allows ulps where
/// the two values it compares are not both BF16, an alias that is not
/// a pointer parameter or names no input, has a tensor or an expectation of its
/// own, or names another alias); `not_found` for an unknown kernel.
KernelCase kernel_case_from(const SafeTensors& file, std::string name);
/// The case in the file at `path`: every check above made on its header (read_kernel_case_header)
/// before its data is read, then on the whole file. Errors: SafeTensors::read's, and the above.
KernelCase read_kernel_case(const std::filesystem::path& path);
/// The case from the header of the file at `path` (SafeTensors::read_header) and its tolerances:
/// every check above, its inputs' and expectations' dtypes and shapes with no data. Enough for
/// `case show`, for picking a case by its entry, and for refusing a file before reading it.
/// Errors: SafeTensors::read_header's, and the above.
KernelCase read_kernel_case_header(const std::filesystem::path& path);
/// Whether tensor `name` is a tolerance (`tolerance.<param>`, `backend_tolerance.<param>`): the
/// tensors read_kernel_case_header reads whole, as SafeTensors::read_header's filter.
bool is_tolerance_tensor(const std::string& name);
/// The same for `file`, already read from `path` (its errors name the path).
KernelCase read_kernel_case(const SafeTensors& file, const std::filesystem::path& path);

/// Upload the inputs (an alias gets its input's buffer), call the kernel's
/// launcher, synchronize and download every pointer parameter that has an
/// expected tensor (or, with `all`, every input). Device memory is freed on every path. Errors: the launcher's and the
/// backend's, with the case name as context.
std::map<std::string, Tensor> run_kernel_case(GpuBackend& gpu, const KernelCase& c, bool all = false);

struct OutputCheck {
  std::string output;
  std::size_t count = 0, bad = 0;
  double max_abs = 0, max_rel = 0;  // over all elements
  /// The largest error as a fraction of what its element's tolerance allows (abs + rel·|want|,
  /// or the ULPs where those are allowed, whichever allows more): at most 1 passes; infinite for
  /// a non-finite mismatch or an error where nothing is allowed.
  double tolerance_used = 0;
  /// For the report: the failing element furthest from its expectation, "[i] got g expected w";
  /// where none fails, the element nearest its tolerance, "... (within its tolerance)"; empty
  /// where every element is exact.
  std::string worst;
  bool pass = false;
};
/// Compare an output with its expectation. NaN passes only against NaN, an
/// infinity only against the same infinity, a finite expectation only with a
/// finite value within `tol` (as numpy's isclose); a size mismatch fails.
OutputCheck check_output(const std::string& name, const Tensor& got, const Tensor& want, const Tolerance& tol);

/// The tolerance of one backend's result against another's for the same
/// arithmetic: BF16 within one ulp, FP16 within 2^-10 relative (one ulp), FP32 within 1e-6
/// relative, integers and bytes exact; plus an absolute floor of `floor` (1e-6) of the output's largest
/// value for results that cancel to near zero, or that differ by a rounding
/// that went the other way inside the kernel.
Tolerance same_arithmetic_tolerance(const Tensor& want, double floor = 1e-6);
/// The tolerance of `output` against the case's expectation `want`: the case's `tolerance` entry,
/// else same_arithmetic_tolerance(want) (an expectation without one is taken as another
/// backend's result; `metrale case run` and `conform` both judge by this), its relative part at
/// least the coarser format's one ULP (BF16 2^-7, F16 2^-10) where `output` (as the kernel stores
/// it) and `want` are floats of two formats.
Tolerance expected_tolerance(const KernelCase& c, const std::string& output, const Tensor& want);
/// The case's backend_tolerance for `output`, else as expected_tolerance's default.
Tolerance backend_tolerance(const KernelCase& c, const std::string& output, const Tensor& want);

/// A case as a person reads it (`metrale case show`): the kernel, the launch shape (recorded, or
/// the launcher's), each scalar with its kind, each input's dtype, shape and bytes (an alias as
/// the input it shares), each expectation with the tolerance `case run` judges it by (the case's
/// own, or the default) and any backend tolerance. Lines end in '\n'. No errors.
std::string describe_kernel_case(const KernelCase& c);

}  // namespace metrale
