// libtorch's own distributed runtime (c10d) for ranks that a torchrun-style launcher started:
// the TCPStore rendezvous at MASTER_ADDR:MASTER_PORT and the Gloo process group over it, as
// `torch.distributed.init_process_group("gloo", init_method="env://")` makes them. tch has no
// distributed API; these calls are the part of it lake's trainer needs.
//
// The Gloo part builds where Gloo's headers are (USE_C10D_GLOO; Debian's libgloo-dev): libtorch
// holds Gloo compiled, and the shim only names its types through ProcessGroupGloo.hpp.
//
// Every entry catches C++ exceptions and returns their message through `err` (NUL-terminated,
// cut to `err_len`), so no exception crosses into Rust.

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

namespace {

void set_error(char* err, size_t err_len, const char* message) {
  if (err == nullptr || err_len == 0) return;
  std::strncpy(err, message, err_len - 1);
  err[err_len - 1] = '\0';
}

template <typename F>
int guarded(char* err, size_t err_len, F&& f) {
  try {
    f();
    return 0;
  } catch (const c10::Error& e) {
    set_error(err, err_len, e.what_without_backtrace());
  } catch (const std::exception& e) {
    set_error(err, err_len, e.what());
  } catch (...) {
    set_error(err, err_len, "unknown C++ exception");
  }
  return -1;
}

at::ScalarType scalar_type(int dtype) { return dtype == 1 ? at::kDouble : at::kFloat; }

}  // namespace

// The rendezvous store of one job: rank 0 serves it unless the launcher's agent already does
// (torchrun's TORCHELASTIC_USE_AGENT_STORE); every key lake writes is under "lake/".
struct lake_c10d_store {
  c10::intrusive_ptr<c10d::Store> store;
};

extern "C" lake_c10d_store* lake_c10d_store_open(const char* host, uint16_t port, int world_size, int is_server,
                                                 int64_t timeout_ms, char* err, size_t err_len) {
  lake_c10d_store* out = nullptr;
  guarded(err, err_len, [&] {
    c10d::TCPStoreOptions options;
    options.port = port;
    options.isServer = is_server != 0;
    options.numWorkers = static_cast<size_t>(world_size);
    options.waitWorkers = true;
    options.multiTenant = true;
    options.timeout = std::chrono::milliseconds(timeout_ms);
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host), options);
    out = new lake_c10d_store{c10::make_intrusive<c10d::PrefixStore>("lake", tcp)};
  });
  return out;
}

extern "C" void lake_c10d_store_close(lake_c10d_store* store) { delete store; }

extern "C" int lake_c10d_store_set(lake_c10d_store* store, const char* key, const uint8_t* value, size_t len, char* err,
                                   size_t err_len) {
  return guarded(err, err_len, [&] { store->store->set(key, std::vector<uint8_t>(value, value + len)); });
}

// Waits for `key` (up to the store's timeout) and copies its value into `out`; `len` is its
// length, which may exceed `cap` (then only `cap` bytes are copied).
extern "C" int lake_c10d_store_get(lake_c10d_store* store, const char* key, uint8_t* out, size_t cap, size_t* len,
                                   char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    const auto value = store->store->get(key);
    *len = value.size();
    std::memcpy(out, value.data(), std::min(cap, value.size()));
  });
}

#ifdef USE_C10D_GLOO
// A Gloo process group over a store.
struct lake_c10d_gloo {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
};

// The process group's TCP device binds to GLOO_SOCKET_IFNAME's interface when it is set (as
// torch.distributed does), else to the address this host's name resolves to.
extern "C" lake_c10d_gloo* lake_c10d_gloo_open(lake_c10d_store* store, int rank, int world_size, int64_t timeout_ms,
                                               char* err, size_t err_len) {
  lake_c10d_gloo* out = nullptr;
  guarded(err, err_len, [&] {
    auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(timeout_ms));
    const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
    options->devices.push_back(interface != nullptr && interface[0] != '\0'
                                   ? c10d::ProcessGroupGloo::createDeviceForInterface(interface)
                                   : c10d::ProcessGroupGloo::createDefaultDevice());
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>("gloo", store->store), rank, world_size, options);
    out = new lake_c10d_gloo{group};
  });
  return out;
}

extern "C" void lake_c10d_gloo_close(lake_c10d_gloo* gloo) { delete gloo; }

// Sums `count` values (dtype 0: float32, 1: float64) at `data` over every rank, in place.
extern "C" int lake_c10d_gloo_all_reduce_sum(lake_c10d_gloo* gloo, void* data, int64_t count, int dtype, char* err,
                                             size_t err_len) {
  return guarded(err, err_len, [&] {
    std::vector<at::Tensor> tensors{at::from_blob(data, {count}, at::TensorOptions().dtype(scalar_type(dtype)))};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    gloo->group->allreduce(tensors, options)->wait();
  });
}

// Replaces `count` values at `data` with rank `root`'s, on every rank.
extern "C" int lake_c10d_gloo_broadcast(lake_c10d_gloo* gloo, void* data, int64_t count, int dtype, int root,
                                        char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    std::vector<at::Tensor> tensors{at::from_blob(data, {count}, at::TensorOptions().dtype(scalar_type(dtype)))};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    gloo->group->broadcast(tensors, options)->wait();
  });
}

#endif  // USE_C10D_GLOO
