"""Metal Shading Language source -> C++17 translation unit for the CPU harness.

The .metal file goes through the C preprocessor first (so instantiation macros
expand and #include works), then a few text rewrites turn the MSL-only syntax
into C++ without changing the line count (diagnostics and collective call sites
keep pointing at the .metal/.h lines). Kernel signatures are parsed to generate
launchers that bind [[buffer(n)]], [[threadgroup(n)]] and built-in parameters
by position; the C++ compiler deduces each parameter's type.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

INCLUDE_DIR = Path(__file__).resolve().parent / "include"
STUB_DIR = INCLUDE_DIR / "metal_stub"

BUILTINS = {
    "thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
    "threads_per_threadgroup", "dispatch_threads_per_threadgroup", "threadgroups_per_grid",
    "threads_per_grid", "grid_size", "thread_index_in_threadgroup", "thread_index_in_simdgroup",
    "simdgroup_index_in_threadgroup", "simdgroups_per_threadgroup",
    "dispatch_simdgroups_per_threadgroup", "threads_per_simdgroup", "thread_execution_width",
    "thread_index_in_quadgroup", "quadgroup_index_in_threadgroup",
}


class MslCompileError(RuntimeError):
    """The .metal source could not be translated or compiled (message has the compiler output)."""


@dataclass
class Binding:
    kind: str  # "buffer", "threadgroup" or a built-in name
    index: int | None


@dataclass
class Kernel:
    function: str
    bindings: list[Binding]
    is_template: bool


@dataclass
class Entry:
    host_name: str
    function: str
    template_args: str  # "<half, 128, 16>" or ""


@dataclass
class FunctionConstant:
    index: int
    name: str
    type: str


@dataclass
class Translation:
    cpp: str
    entries: list[Entry] = field(default_factory=list)
    kernels: dict[str, Kernel] = field(default_factory=dict)
    function_constants: list[FunctionConstant] = field(default_factory=list)


# Metal 4 sources (those using the tensor API of MetalPerformancePrimitives, whose
# matmul2d takes its descriptor as a class-type template argument) are C++20; the
# rest stay C++17 with Metal 3.1's version macro.


def language_flags(path: Path) -> tuple[str, ...]:
    """The C++ standard and Metal version macros a .metal file is read with."""
    from vllm_metal.native.kernel_sources import uses_tensor_ops

    if uses_tensor_ops(path):
        return ("-std=c++20", "-D__METAL_VERSION__=400", "-D__HAVE_TENSOR__=1")
    return ("-std=c++17", "-D__METAL_VERSION__=310")


def preprocess(path: Path, defines: dict[str, object], cxx: str) -> str:
    """Run the C preprocessor on a .metal file (line markers kept)."""
    args = [cxx, "-E", "-x", "c++", *language_flags(path), f"-I{STUB_DIR}", f"-I{path.parent}",
            "-D__METAL__=1"]
    args += [f"-D{k}={v}" for k, v in defines.items()]
    result = subprocess.run([*args, str(path)], capture_output=True, text=True, check=False)
    if result.returncode:
        raise MslCompileError(f"preprocessing {path.name} failed:\n{result.stderr}")
    return result.stdout


def _blank(text: str) -> str:
    """Same newlines, everything else removed: keeps later line numbers right."""
    return "\n" * text.count("\n")


def _matching(text: str, start: int, open_ch: str, close_ch: str) -> int:
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i
    raise MslCompileError(f"unbalanced {open_ch}{close_ch} near: {text[start:start + 80]!r}")


def _split_params(params: str) -> list[str]:
    """Split a parameter list on top-level commas (not inside <>, (), [] or [[ ]])."""
    out, depth, current = [], 0, []
    for ch in params:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(current))
            current = []
        else:
            current.append(ch)
    if "".join(current).strip():
        out.append("".join(current))
    return out


_FUNCTION_CONSTANT = re.compile(
    r"\bconstant\s+([\w:<>, ]+?)\s+(\w+)\s*\[\[\s*function_constant\s*\(\s*(\d+)\s*\)\s*\]\]\s*;")
_HALF_LITERAL = re.compile(r"(?<![\w.])((?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)[hH]\b")
_INSTANTIATION = re.compile(
    r"template\s*\[\[\s*host_name\s*\(\s*((?:\"[^\"]*\"\s*)+)\)\s*\]\]\s*(?:\[\[\s*kernel\s*\]\]\s*)?"
    r"decltype\s*\(")
# `threadgroup T name[dims];` at statement start (pointers and references stay as they are).
_THREADGROUP_DECL = re.compile(
    r"(?<=[;{}])(?P<pre>(?:\s|#[^\n]*\n)*)threadgroup\s+(?P<type>[\w:<>, ]+?)\s+(?P<name>\w+)\s*"
    r"(?P<dims>(?:\[[^\];]*\]\s*)*);")
_KERNEL = re.compile(r"(?:\bkernel\b|\[\[\s*kernel\s*\]\])\s*void\s+(\w+)\s*\(")
_ATTRIBUTE = re.compile(r"\[\[\s*(\w+)\s*(?:\(([^()\]]*)\))?\s*\]\]")
_STRIPPED_ATTRIBUTES = {"kernel", "buffer", "threadgroup", "function_constant", "host_name",
                        "max_total_threads_per_threadgroup", "user", *BUILTINS}


def _rewrite_function_constants(src: str, out: Translation) -> str:
    def replace(m: re.Match) -> str:
        typ, name, index = m.group(1).strip(), m.group(2), int(m.group(3))
        out.function_constants.append(FunctionConstant(index, name, typ))
        # Set per launch by msl_hx::run_entry, so one build serves every value.
        return f"static {typ} {name}; static bool msl_hx_defined_{name} = false;"

    src = _FUNCTION_CONSTANT.sub(replace, src)
    return re.sub(r"\bis_function_constant_defined\s*\(\s*(\w+)\s*\)", r"msl_hx_defined_\1", src)


def _rewrite_instantiations(src: str, out: Translation) -> str:
    pieces, pos = [], 0
    for m in _INSTANTIATION.finditer(src):
        if m.start() < pos:
            continue
        host = "".join(re.findall(r'"([^"]*)"', m.group(1)))
        close = _matching(src, m.end() - 1, "(", ")")
        inner = src[m.end():close].strip()
        mm = re.match(r"([\w:]+)\s*(<.*>)\s*$", inner, re.DOTALL)
        if not mm:
            raise MslCompileError(f"cannot parse the instantiation of {host!r}: decltype({inner})")
        end = src.index(";", close)
        out.entries.append(Entry(host, mm.group(1), re.sub(r"\s+", " ", mm.group(2))))
        pieces.append(src[pos:m.start()])
        pieces.append(_blank(src[m.start():end + 1]))
        pos = end + 1
    pieces.append(src[pos:])
    return "".join(pieces)


def _rewrite_threadgroup_decls(src: str) -> str:
    def replace(m: re.Match) -> str:
        name, dims = m.group("name"), " ".join(m.group("dims").split())
        kept_newlines = m.group(0)[len(m.group("pre")):].count("\n")
        return (f"{m.group('pre')}static thread_local {m.group('type').strip()} {name}{dims}; "
                f"static thread_local msl_hx::ThreadgroupVar msl_hx_tg_{name}; "
                f"msl_hx::threadgroup_var(&{name}, sizeof({name}), msl_hx_tg_{name});"
                + "\n" * kept_newlines)

    src = _THREADGROUP_DECL.sub(replace, src)
    # A declaration left as it is would silently become one private copy per lane.
    left = re.search(r"(?<=[;{}])\s*threadgroup\s+[^;(]*?\b\w+\s*[\[;]", src)
    if left and not re.search(r"[*&]", left.group(0)):
        raise MslCompileError(f"unsupported threadgroup declaration: {left.group(0).strip()}")
    return src


def _parse_kernels(src: str, out: Translation) -> None:
    for m in _KERNEL.finditer(src):
        name = m.group(1)
        close = _matching(src, m.end() - 1, "(", ")")
        bindings = []
        for param in _split_params(src[m.end():close]):
            attr = _ATTRIBUTE.search(param)
            if not attr:
                raise MslCompileError(f"kernel {name}: parameter without an attribute: {param.strip()}")
            kind, arg = attr.group(1), attr.group(2)
            if kind not in ("buffer", "threadgroup") and kind not in BUILTINS:
                raise MslCompileError(f"kernel {name}: unsupported parameter attribute [[{kind}]]")
            bindings.append(Binding(kind, int(arg) if arg else None))
        before = re.sub(r"#[^\n]*\n", "", src[max(0, m.start() - 600):m.start()])
        is_template = bool(re.search(r"template\s*<[^;{}]*>\s*$", before))
        out.kernels[name] = Kernel(name, bindings, is_template)


def _strip_attributes(src: str) -> str:
    return _ATTRIBUTE.sub(lambda m: "" if m.group(1) in _STRIPPED_ATTRIBUTES else m.group(0), src)


def _launcher(translation: Translation) -> str:
    lines = ["", "#line 1 \"msl_harness_launchers\"", "namespace msl_hx_generated {"]
    entries = [Entry(k.function, k.function, "") for k in translation.kernels.values() if not k.is_template]
    entries += [e for e in translation.entries if e.function in translation.kernels]
    unknown = [e.host_name for e in translation.entries if e.function not in translation.kernels]
    if unknown:
        raise MslCompileError(f"instantiations of functions that are not kernels: {unknown}")
    translation.entries = entries
    table = []
    for i, e in enumerate(entries):
        kernel = translation.kernels[e.function]
        fn = f"{e.function}{e.template_args}"
        args = []
        for k, b in enumerate(kernel.bindings):
            p = f"msl_hx::param_t<F, {k}>"
            if b.kind == "buffer":
                args.append(f"msl_hx::buffer_as<{p}>({b.index})")
            elif b.kind == "threadgroup":
                args.append(f"msl_hx::threadgroup_as<{p}>({b.index})")
            else:
                args.append(f"msl_hx::builtin_as<{p}>(msl_hx::Builtins::{b.kind}())")
        lines.append(f"static void kernel_{i}() {{ using F = decltype(&{fn}); {fn}({', '.join(args)}); }}")
        buffers = ",".join(str(b.index) for b in kernel.bindings if b.kind == "buffer")
        tgs = ",".join(str(b.index) for b in kernel.bindings if b.kind == "threadgroup")
        table.append(f'  {{"{e.host_name}", &msl_hx_generated::kernel_{i}, "{buffers}", "{tgs}"}},')
    lines.append("}  // namespace msl_hx_generated")
    lines.append("extern \"C\" const msl_hx_entry msl_hx_entries[] = {")
    lines += table
    lines.append("  {nullptr, nullptr, nullptr, nullptr}};")
    lines.append(f"extern \"C\" const int msl_hx_num_entries = {len(entries)};")
    lines.append("extern \"C\" msl_hx_function_constant msl_hx_function_constants[] = {")
    for fc in translation.function_constants:
        lines.append(f'  {{{fc.index}, "{fc.name}", [](double v) {{ {fc.name} = ({fc.type})(v); }}, '
                     f"&msl_hx_defined_{fc.name}}},")
    lines.append("  {-1, nullptr, nullptr, nullptr}};")
    lines.append(f"extern \"C\" const int msl_hx_num_function_constants = {len(translation.function_constants)};")
    lines.append("extern \"C\" int msl_hx_run(msl_hx_launch* launch, int entry) {")
    lines.append("  return msl_hx::run_entry(launch, msl_hx_entries[entry].body, msl_hx_function_constants,")
    lines.append("                           msl_hx_num_function_constants);")
    lines.append("}")
    return "\n".join(lines) + "\n"


def translate(preprocessed: str) -> Translation:
    """C++ text (prelude include + rewritten source + launchers) for preprocessed MSL."""
    out = Translation(cpp="")
    code = re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: _blank(m.group(0)), preprocessed, flags=re.DOTALL)
    if re.search(r"\bdouble\b", re.sub(r"#[^\n]*\n", "\n", code)):
        raise MslCompileError("Metal has no double type: the source uses 'double'")
    src = _rewrite_function_constants(preprocessed, out)
    src = re.sub(r"\bconst\s+constant\b|\bconstant\s+const\b", "constant", src)
    src = _HALF_LITERAL.sub(
        lambda m: f"half({m.group(1)}{'f' if re.search(r'[.eE]', m.group(1)) else '.0f'})", src)
    src = _rewrite_instantiations(src, out)
    src = _rewrite_threadgroup_decls(src)
    _parse_kernels(src, out)
    src = _strip_attributes(src)
    out.cpp = f'#include "msl_prelude.h"\n{src}\n{_launcher(out)}'
    return out


def translate_file(path: Path, defines: dict[str, object], cxx: str) -> Translation:
    return translate(preprocess(Path(path), defines, cxx))
