# Builds the tensor-op metallib (cmake -P; kernels_v2.cmake runs it) and never
# fails the build: a toolchain without Metal 4, or a compile error only Apple's
# compiler finds, leaves the build without the library and says why (a warning);
# the NaxPrefill route then stays off and every other kernel serves.
#
# -D arguments: SOURCES and FLAGS ("|"-separated lists), AIR_DIR, METALLIB,
# STAMP (touched when done, either way), VLLM_METAL_TENSOR_MACOS_MIN.
include("${CMAKE_CURRENT_LIST_DIR}/metallib_commands.cmake")
string(REPLACE "|" ";" _sources "${SOURCES}")
string(REPLACE "|" ";" _flags "${FLAGS}")
file(REMOVE "${METALLIB}")
file(MAKE_DIRECTORY "${AIR_DIR}")

# Runs `command` (a list); on failure warns with its output and stops the script.
macro(_vllm_metal_try what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(WARNING "vllm-metal: no tensor-op library, so the NaxPrefill route stays off: "
                    "${what} failed (${_rc}):\n${_out}${_err}")
    file(REMOVE "${METALLIB}")
    file(TOUCH "${STAMP}")
    return()
  endif()
endmacro()

set(_airs "")
foreach(_source IN LISTS _sources)
  get_filename_component(_stem "${_source}" NAME_WE)
  set(_air "${AIR_DIR}/${_stem}.air")
  vllm_metal_air_command(_compile "${VLLM_METAL_TENSOR_MACOS_MIN}" "${_source}" "${_air}" ${_flags})
  _vllm_metal_try("compiling ${_source}" ${_compile})
  list(APPEND _airs "${_air}")
endforeach()
vllm_metal_link_command(_link "${VLLM_METAL_TENSOR_MACOS_MIN}" "${METALLIB}" ${_airs})
_vllm_metal_try("linking ${METALLIB}" ${_link})
file(TOUCH "${STAMP}")
