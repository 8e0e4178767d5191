// Normal values as `torch.randn(..., generator=torch.Generator(device).manual_seed(seed))` makes
// them: a generator of their own, of the values' device, seeded with `seed`. tch exposes no
// generator other than the default one, whose draws dropout and the policies' noise take.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <cstring>

// Fills `count` float32 values at `data` (host memory when `cuda_index` is negative, else memory
// of that CUDA device, written on its current stream) with standard normals from a new generator
// seeded with `seed`. Returns 0, or -1 with libtorch's message in `err`.
extern "C" int lake_randn_seeded(float* data, int64_t count, int cuda_index, uint64_t seed, char* err, size_t err_len) {
  const char* message = "unknown C++ exception";
  try {
    const bool cuda = cuda_index >= 0;
    const auto device = cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(cuda_index)) : at::Device(at::kCPU);
    at::Tensor out = at::from_blob(data, {count}, at::TensorOptions().dtype(at::kFloat).device(device));
    at::Generator generator = cuda ? at::detail::getCUDAHooks().getNewGenerator(device.index()) : at::detail::createCPUGenerator(seed);
    generator.set_current_seed(seed);
    out.normal_(0.0, 1.0, generator);
    return 0;
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
    std::strncpy(err, message, err_len - 1);
  } catch (const std::exception& e) {
    std::strncpy(err, e.what(), err_len - 1);
  } catch (...) {
    std::strncpy(err, message, err_len - 1);
  }
  err[err_len - 1] = '\0';
  return -1;
}
