// Which platform code paths this build compiles. VLLM_METAL_APPLE() is 1 on
// Apple platforms: the Metal eval_gpu bodies and the IORegistry probe. Test it
// with `#if VLLM_METAL_APPLE()`: it is function-like so that a file testing it
// without including this header fails to compile, where an undefined plain
// macro would silently take the non-Apple branch on a Mac.
//
// VLLM_METAL_APPLE_SYNTAX_CHECK selects the Apple paths elsewhere, for the check
// that compiles them on Linux against MLX's real headers and stand-in Apple
// declarations (tests/native/test_apple_sources_compile.py). It is a macro of
// ours rather than a predefined __APPLE__, which would also switch Python's,
// nanobind's and MLX's own headers to their macOS branches over the Linux
// system headers: the check would then compile neither platform's code.
#pragma once

#if defined(__APPLE__) || defined(VLLM_METAL_APPLE_SYNTAX_CHECK)
#define VLLM_METAL_APPLE() 1
#else
#define VLLM_METAL_APPLE() 0
#endif
