# The xcrun commands that build the kernels_v2 metallib, as functions so that a
# test prints them on any platform (cmake -P).
#
# The library must load on macOS as old as VLLM_METAL_MACOS_MIN. Without
# -mmacosx-version-min the Metal compiler stamps the AIR and the library with
# the SDK's macOS version (a macOS 26 SDK makes a library that macOS 15 refuses
# to load), so both steps take it. The link runs `metal`, which accepts the flag
# (`metallib` does not), as MLX's own metallib build does.
set(VLLM_METAL_MACOS_MIN "14.0" CACHE STRING
    "Oldest macOS the kernels_v2 metallib loads on (-std=metal3.1 needs 14.0)")

# out: the command compiling `source` to `air`; further arguments are compiler flags.
function(vllm_metal_air_command out source air)
  set(${out} xcrun -sdk macosx metal ${ARGN} "-mmacosx-version-min=${VLLM_METAL_MACOS_MIN}"
             -c "${source}" -o "${air}" PARENT_SCOPE)
endfunction()

# out: the command linking the AIR files (further arguments) into `metallib`.
function(vllm_metal_link_command out metallib)
  set(${out} xcrun -sdk macosx metal "-mmacosx-version-min=${VLLM_METAL_MACOS_MIN}" ${ARGN}
             -o "${metallib}" PARENT_SCOPE)
endfunction()
