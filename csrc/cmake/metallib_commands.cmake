# The xcrun commands that build the kernels_v2 metallibs, as functions so that a
# test prints them on any platform (cmake -P).
#
# A library must load on macOS as old as its minimum. Without
# -mmacosx-version-min the Metal compiler stamps the AIR and the library with
# the SDK's macOS version (a macOS 26 SDK makes a library that macOS 15 refuses
# to load), so both steps take it. The link runs `metal`, which accepts the flag
# (`metallib` does not), as MLX's own metallib build does.
set(VLLM_METAL_MACOS_MIN "14.0" CACHE STRING
    "Oldest macOS the main kernels_v2 metallib loads on (-std=metal3.1 needs 14.0)")
# The tensor-op library (-std=metal4.0, MetalPerformancePrimitives) needs macOS
# 26; MLX turns the tensor units on from 26.2.
set(VLLM_METAL_TENSOR_MACOS_MIN "26.0" CACHE STRING
    "Oldest macOS the tensor-op kernels_v2 metallib loads on (-std=metal4.0 needs 26.0)")

# out: the command compiling `source` to `air` for macOS `min` and later;
# further arguments are compiler flags.
function(vllm_metal_air_command out min source air)
  set(${out} xcrun -sdk macosx metal ${ARGN} "-mmacosx-version-min=${min}"
             -c "${source}" -o "${air}" PARENT_SCOPE)
endfunction()

# out: the command linking the AIR files (further arguments) into `metallib`
# for macOS `min` and later.
function(vllm_metal_link_command out min metallib)
  set(${out} xcrun -sdk macosx metal "-mmacosx-version-min=${min}" ${ARGN}
             -o "${metallib}" PARENT_SCOPE)
endfunction()
