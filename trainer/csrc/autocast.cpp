// Mixed precision as torch.autocast does it: libtorch's autocast state for one device type,
// with bfloat16 as the lower precision. tch exposes autocast for CUDA only and at its default
// dtype (float16); these two calls are the rest of what `torch.autocast(device_type, dtype)`
// sets. Autocast state is per thread: enter and exit on the thread that runs the forward pass.

#include <ATen/autocast_mode.h>

namespace {
at::DeviceType device_type(int cuda) { return cuda ? at::kCUDA : at::kCPU; }
}  // namespace

// Turns bfloat16 autocast on for the device type; returns whether it was on before (0 or 1),
// or -1 when libtorch refused.
extern "C" int lake_autocast_bf16_enter(int cuda) {
  try {
    const auto type = device_type(cuda);
    const bool was = at::autocast::is_autocast_enabled(type);
    at::autocast::set_autocast_dtype(type, at::kBFloat16);
    at::autocast::set_autocast_enabled(type, true);
    at::autocast::increment_nesting();
    return was ? 1 : 0;
  } catch (...) {
    return -1;
  }
}

// Restores what enter found (`was`), dropping the cast weights' cache when the outermost
// autocast region ends; returns 0, or -1 when libtorch refused.
extern "C" int lake_autocast_exit(int cuda, int was) {
  try {
    const auto type = device_type(cuda);
    if (at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
    }
    at::autocast::set_autocast_enabled(type, was != 0);
    return 0;
  } catch (...) {
    return -1;
  }
}
