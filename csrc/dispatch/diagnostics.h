// Records which route the most recent paged-attention call took, for
// `debug.set_paged_dispatch_diagnostics(True)` / `debug.last_paged_dispatch()`.
#pragma once

#include <optional>
#include <string>

#include "dispatch/paged_dispatch.h"

namespace vllm_metal::dispatch {

void set_paged_dispatch_diagnostics(bool enabled);
// Called by eval_gpu / eval_cpu with the decision they executed (no-op when off).
void record_paged_dispatch(const PagedDispatch& dispatch);
// Route name of the last recorded call; None before any (or when off).
std::optional<std::string> last_paged_dispatch();
// Keys per partition of the last recorded GqaDecode call (256 or 512 on Metal;
// on the CPU backend its even piece size), else None.
std::optional<int> last_gqa_partition_size();

}  // namespace vllm_metal::dispatch
