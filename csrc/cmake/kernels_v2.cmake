# kernels_v2/: the Metal sources. Every platform: the include path (the host
# shares kernel_constants.h and paged_attention_params.h with the shaders), the
# sources' hash stamp (vllm_metal.native refuses stale builds) and the sources
# in the package (JIT mode). macOS: the .metallib files (the main library and,
# where the toolchain has Metal 4, the tensor-op one), built here with the same
# kernel constants, so the first request compiles nothing.
set(VLLM_METAL_KERNELS_DIR "${CMAKE_CURRENT_SOURCE_DIR}/../kernels_v2")
file(GLOB _vllm_metal_kernel_files RELATIVE "${VLLM_METAL_KERNELS_DIR}" CONFIGURE_DEPENDS
     "${VLLM_METAL_KERNELS_DIR}/*.h" "${VLLM_METAL_KERNELS_DIR}/*.metal")
list(SORT _vllm_metal_kernel_files)

# Stamp: sha256 over "name\nsha256(content)\n" of the sorted files; the same
# recipe as vllm_metal.native.kernels_hash().
set(_stamp_text "")
set(_vllm_metal_kernel_paths "")
foreach(_file IN LISTS _vllm_metal_kernel_files)
  set(_path "${VLLM_METAL_KERNELS_DIR}/${_file}")
  file(SHA256 "${_path}" _hash)
  string(APPEND _stamp_text "${_file}\n${_hash}\n")
  list(APPEND _vllm_metal_kernel_paths "${_path}")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_path}")
endforeach()
string(SHA256 VLLM_METAL_KERNELS_HASH "${_stamp_text}")
message(STATUS "vllm-metal: kernels_v2 hash ${VLLM_METAL_KERNELS_HASH}")

target_include_directories(_ext PRIVATE "${VLLM_METAL_KERNELS_DIR}")
target_compile_definitions(_ext PRIVATE "VLLM_METAL_KERNELS_HASH=\"${VLLM_METAL_KERNELS_HASH}\"")
install(FILES ${_vllm_metal_kernel_paths} DESTINATION vllm_metal/kernels_v2)

if(APPLE)
  include(${CMAKE_CURRENT_LIST_DIR}/metallib_commands.cmake)
  target_sources(_ext PRIVATE metal/launches.cpp metal/paged_attention_metal.cpp metal/lora_metal.cpp
                              metal/experts_metal.cpp metal/mla_metal.cpp
                              metal/gdn_metal.cpp)
  target_link_libraries(_ext PRIVATE "-framework IOKit" "-framework CoreFoundation")

  # Tensor-op files (Metal 4's MetalPerformancePrimitives) go to a library of
  # their own; the rule that names them is kernel_sources.py's, run as a script.
  execute_process(
    COMMAND "${Python_EXECUTABLE}" "${CMAKE_CURRENT_SOURCE_DIR}/../vllm_metal/native/kernel_sources.py"
            tensor-op-files "${VLLM_METAL_KERNELS_DIR}"
    OUTPUT_VARIABLE _tensor_files
    OUTPUT_STRIP_TRAILING_WHITESPACE
    COMMAND_ERROR_IS_FATAL ANY)
  string(REPLACE "\n" ";" _tensor_files "${_tensor_files}")

  # -fno-fast-math: `metal` defaults to fast math, while MLX's JIT (the
  # VLLM_METAL_BUILD_FROM_SOURCE path) and MLX's own metallib compile without it.
  set(_common_flags -fno-fast-math "-I${VLLM_METAL_KERNELS_DIR}"
      "-DVLLM_METAL_PARTITION_SIZE=${VLLM_METAL_PARTITION_SIZE}"
      "-DVLLM_METAL_KERNEL_BLOCK_SIZES=${VLLM_METAL_KERNEL_BLOCK_SIZES}")
  set(_airs "")
  set(_tensor_sources "")
  foreach(_file IN LISTS _vllm_metal_kernel_files)
    if(NOT _file MATCHES "\\.metal$")
      continue()
    endif()
    if(_file IN_LIST _tensor_files)
      list(APPEND _tensor_sources "${VLLM_METAL_KERNELS_DIR}/${_file}")
      continue()
    endif()
    get_filename_component(_stem "${_file}" NAME_WE)
    set(_air "${CMAKE_CURRENT_BINARY_DIR}/kernels_v2/${_stem}.air")
    vllm_metal_air_command(_compile "${VLLM_METAL_MACOS_MIN}" "${VLLM_METAL_KERNELS_DIR}/${_file}" "${_air}"
                           -std=metal3.1 ${_common_flags})
    add_custom_command(
      OUTPUT "${_air}"
      COMMAND "${CMAKE_COMMAND}" -E make_directory "${CMAKE_CURRENT_BINARY_DIR}/kernels_v2"
      COMMAND ${_compile}
      DEPENDS ${_vllm_metal_kernel_paths}
      COMMENT "Compiling kernels_v2/${_file}"
      VERBATIM)
    list(APPEND _airs "${_air}")
  endforeach()
  set(VLLM_METAL_METALLIB "${CMAKE_CURRENT_BINARY_DIR}/vllm_metal_kernels.metallib")
  vllm_metal_link_command(_link "${VLLM_METAL_MACOS_MIN}" "${VLLM_METAL_METALLIB}" ${_airs})
  add_custom_command(
    OUTPUT "${VLLM_METAL_METALLIB}"
    COMMAND ${_link}
    DEPENDS ${_airs}
    COMMENT "Linking vllm_metal_kernels.metallib"
    VERBATIM)
  add_custom_target(vllm_metal_metallib ALL DEPENDS "${VLLM_METAL_METALLIB}")
  install(FILES "${VLLM_METAL_METALLIB}" DESTINATION vllm_metal)

  # The tensor-op library: built when the toolchain can (tensor_metallib.cmake
  # warns and builds nothing otherwise), installed when it was built.
  if(_tensor_sources)
    set(VLLM_METAL_TENSOR_METALLIB "${CMAKE_CURRENT_BINARY_DIR}/vllm_metal_tensor_kernels.metallib")
    set(_tensor_stamp "${CMAKE_CURRENT_BINARY_DIR}/vllm_metal_tensor_kernels.stamp")
    string(REPLACE ";" "|" _tensor_sources_arg "${_tensor_sources}")
    string(REPLACE ";" "|" _tensor_flags_arg "-std=metal4.0;${_common_flags}")
    add_custom_command(
      OUTPUT "${_tensor_stamp}"
      COMMAND "${CMAKE_COMMAND}" "-DSOURCES=${_tensor_sources_arg}" "-DFLAGS=${_tensor_flags_arg}"
              "-DAIR_DIR=${CMAKE_CURRENT_BINARY_DIR}/kernels_v2_tensor" "-DMETALLIB=${VLLM_METAL_TENSOR_METALLIB}"
              "-DSTAMP=${_tensor_stamp}" "-DVLLM_METAL_TENSOR_MACOS_MIN=${VLLM_METAL_TENSOR_MACOS_MIN}"
              -P "${CMAKE_CURRENT_LIST_DIR}/tensor_metallib.cmake"
      DEPENDS ${_vllm_metal_kernel_paths} "${CMAKE_CURRENT_LIST_DIR}/tensor_metallib.cmake"
      COMMENT "Compiling the tensor-op kernels_v2 library (Metal 4)"
      VERBATIM)
    add_custom_target(vllm_metal_tensor_metallib ALL DEPENDS "${_tensor_stamp}")
    install(FILES "${VLLM_METAL_TENSOR_METALLIB}" DESTINATION vllm_metal OPTIONAL)
  endif()
endif()
