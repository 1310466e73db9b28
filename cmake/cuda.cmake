# The CUDA half of the build: kernels/*.cu → one fatbin per module (SASS for each of
# METRALE_CUDA_ARCHS, PTX for the last one) embedded in metrale_cuda, plus a PTX file per
# module for the signature check. Only nvcc and the headers are needed, no GPU and no driver.
set(METRALE_CUDA_ARCHS "90;121" CACHE STRING "SASS targets of the kernel fatbins (sm_90 = H200, sm_121 = GB10)")
set(gen ${PROJECT_BINARY_DIR}/kernels)
file(MAKE_DIRECTORY ${gen})
file(GLOB METRALE_KERNEL_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/*.cu)
file(GLOB METRALE_KERNEL_HEADERS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/*.cuh)

set(gencodes "")
set(min_arch 1000)
foreach(arch ${METRALE_CUDA_ARCHS})
  list(APPEND gencodes -gencode=arch=compute_${arch},code=sm_${arch})
  set(last_arch ${arch})
  if(arch LESS min_arch)
    set(min_arch ${arch})
  endif()
endforeach()
list(APPEND gencodes -gencode=arch=compute_${last_arch},code=compute_${last_arch})
set(nvcc_flags -std=c++20 -O3 -lineinfo -I${PROJECT_SOURCE_DIR}/kernels)

set(METRALE_FATBIN_DECLS "")
set(METRALE_FATBIN_TABLE "")
set(embedded "")
set(METRALE_PTX_FILES "")
# Modules of Hopper-only instructions (wgmma): SASS for sm_90a alone, whatever METRALE_CUDA_ARCHS
# says; the backend loads them only on a device of compute capability 9.0.
set(METRALE_SM90A_MODULES mla_wgmma)
foreach(src ${METRALE_KERNEL_SOURCES})
  get_filename_component(module ${src} NAME_WE)
  set(module_gencodes ${gencodes})
  set(module_archs "${METRALE_CUDA_ARCHS}")
  set(ptx_arch compute_90)
  if(module IN_LIST METRALE_SM90A_MODULES)
    set(module_gencodes -gencode=arch=compute_90a,code=sm_90a)
    set(module_archs 90a)
    set(ptx_arch compute_90a)
  endif()
  add_custom_command(OUTPUT ${gen}/${module}.fatbin
                     COMMAND ${CUDAToolkit_NVCC_EXECUTABLE} ${nvcc_flags} -fatbin ${module_gencodes} -o ${gen}/${module}.fatbin ${src}
                     DEPENDS ${src} ${METRALE_KERNEL_HEADERS} COMMENT "nvcc ${module}.cu -> fatbin (${module_archs})")
  add_custom_command(OUTPUT ${gen}/${module}.ptx
                     COMMAND ${CUDAToolkit_NVCC_EXECUTABLE} ${nvcc_flags} -ptx -arch=${ptx_arch} -o ${gen}/${module}.ptx ${src}
                     DEPENDS ${src} ${METRALE_KERNEL_HEADERS} COMMENT "nvcc ${module}.cu -> ptx")
  add_custom_command(OUTPUT ${gen}/${module}_fatbin.cpp
                     COMMAND ${CMAKE_COMMAND} -DIN=${gen}/${module}.fatbin -DOUT=${gen}/${module}_fatbin.cpp
                             -DNAME=${module} -P ${PROJECT_SOURCE_DIR}/cmake/embed.cmake
                     DEPENDS ${gen}/${module}.fatbin ${PROJECT_SOURCE_DIR}/cmake/embed.cmake)
  list(APPEND embedded ${gen}/${module}_fatbin.cpp)
  list(APPEND METRALE_PTX_FILES ${gen}/${module}.ptx)
  string(APPEND METRALE_FATBIN_DECLS "extern const unsigned char ${module}[];\nextern const std::size_t ${module}_size;\n")
  string(APPEND METRALE_FATBIN_TABLE "  if (name == \"${module}\") return {${module}, ${module}_size};\n")
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/cmake/fatbins.cpp.in ${gen}/fatbins.cpp @ONLY)
add_custom_target(metrale_ptx ALL DEPENDS ${METRALE_PTX_FILES})

add_library(metrale_cuda ${PROJECT_SOURCE_DIR}/backends/cuda/cuda_backend.cpp ${gen}/fatbins.cpp ${embedded})
add_library(metrale::cuda ALIAS metrale_cuda)
set_target_properties(metrale_cuda PROPERTIES EXPORT_NAME cuda OUTPUT_NAME metrale_cuda POSITION_INDEPENDENT_CODE ON)
target_include_directories(metrale_cuda PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/backends/cuda>
                                               $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
                                        PRIVATE ${PROJECT_SOURCE_DIR}/backends/cuda ${CUDAToolkit_INCLUDE_DIRS})
target_link_libraries(metrale_cuda PUBLIC metrale_core PRIVATE ${CMAKE_DL_LIBS} spdlog::spdlog $<BUILD_INTERFACE:metrale_warnings>)
target_compile_definitions(metrale_cuda PUBLIC METRALE_WITH_CUDA=1)
# The lowest target: kernels built below sm_90 have no griddepcontrol.wait, so the backend
# launches nothing early (a device could otherwise JIT such a build and run it early).
target_compile_definitions(metrale_cuda PRIVATE METRALE_CUDA_MIN_ARCH=${min_arch})

# bench/hm_trace.cu: the heads-in-M block alone, timed, in builds of kernels/mla_wgmma.cu's
# switches: hm_trace (as the product builds it), hm_trace_cycles (-DMETRALE_HM_TRACE: where its
# warpgroups' cycles go), and the experiments of docs/performance.md's "Thirty-third session" that
# the thirty-fourth timed and did not keep: hm_trace_preg (-DMETRALE_HM_P_REGS) and
# hm_trace_grouped (-DMETRALE_HM_NVFP4_GROUPED). Not built by default (`--target hm_trace`); sm_90a.
set(hm_trace_src ${PROJECT_SOURCE_DIR}/bench/hm_trace.cu)
set(hm_trace_flags ${nvcc_flags} -gencode=arch=compute_90a,code=sm_90a)
set(hm_trace_bins "")
# With FATBIN (an experiment), the build also gets the module's fatbin,
# kernels/variants/<suffix>/mla_wgmma.fatbin, which the CUDA backend loads in place of its own under
# METRALE_CUDA_FATBIN_DIR: the GPU suite, `conform` and the sanitizers can then check the switch's
# very machine code before it is kept.
function(hm_trace_build name)  # [FATBIN] [MACRO ...]: built with -DMACRO each
  cmake_parse_arguments(PARSE_ARGV 1 hm "FATBIN" "" "")
  set(define ${hm_UNPARSED_ARGUMENTS})
  list(TRANSFORM define PREPEND -D)
  string(JOIN " " shown ${define})
  add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/bin/${name}
                     COMMAND ${CUDAToolkit_NVCC_EXECUTABLE} ${hm_trace_flags} ${define}
                             -o ${PROJECT_BINARY_DIR}/bin/${name} ${hm_trace_src}
                     DEPENDS ${hm_trace_src} ${PROJECT_SOURCE_DIR}/bench/trace_util.cuh ${METRALE_KERNEL_SOURCES}
                             ${METRALE_KERNEL_HEADERS}
                     COMMENT "nvcc bench/hm_trace.cu ${shown} -> ${name} (90a)")
  set(outputs ${PROJECT_BINARY_DIR}/bin/${name})
  if(hm_FATBIN)
    string(REPLACE "hm_trace_" "" suffix ${name})
    set(fatbin ${gen}/variants/${suffix}/mla_wgmma.fatbin)
    add_custom_command(OUTPUT ${fatbin}
                       COMMAND ${CMAKE_COMMAND} -E make_directory ${gen}/variants/${suffix}
                       COMMAND ${CUDAToolkit_NVCC_EXECUTABLE} ${hm_trace_flags} ${define} -fatbin -o ${fatbin}
                               ${PROJECT_SOURCE_DIR}/kernels/mla_wgmma.cu
                       DEPENDS ${METRALE_KERNEL_SOURCES} ${METRALE_KERNEL_HEADERS}
                       COMMENT "nvcc mla_wgmma.cu ${shown} -> variants/${suffix}/mla_wgmma.fatbin (90a)")
    list(APPEND outputs ${fatbin})
  endif()
  set(hm_trace_bins ${hm_trace_bins} ${outputs} PARENT_SCOPE)
endfunction()
hm_trace_build(hm_trace)
hm_trace_build(hm_trace_cycles METRALE_HM_TRACE)
hm_trace_build(hm_trace_preg FATBIN METRALE_HM_P_REGS)
hm_trace_build(hm_trace_grouped FATBIN METRALE_HM_NVFP4_GROUPED)
add_custom_target(hm_trace DEPENDS ${hm_trace_bins})

# bench/step_trace.cu: the staged FP8 16-head block in its clusters, alone, with each block's
# phases stamped on the wall clock (-DMETRALE_STEP_TRACE): where a memory-bound step's fixed cost
# goes. Not built by default (`--target step_trace`); sm_90a.
add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/bin/step_trace
                   COMMAND ${CUDAToolkit_NVCC_EXECUTABLE} ${hm_trace_flags} -DMETRALE_STEP_TRACE
                           -o ${PROJECT_BINARY_DIR}/bin/step_trace ${PROJECT_SOURCE_DIR}/bench/step_trace.cu
                   DEPENDS ${PROJECT_SOURCE_DIR}/bench/step_trace.cu ${PROJECT_SOURCE_DIR}/bench/trace_util.cuh
                           ${METRALE_KERNEL_SOURCES} ${METRALE_KERNEL_HEADERS}
                   COMMENT "nvcc bench/step_trace.cu -DMETRALE_STEP_TRACE -> step_trace (90a)")
add_custom_target(step_trace DEPENDS ${PROJECT_BINARY_DIR}/bin/step_trace)
