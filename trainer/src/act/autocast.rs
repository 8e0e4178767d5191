//! bfloat16 mixed precision as `torch.autocast(device_type, dtype=torch.bfloat16)` (what
//! lerobot-train runs under accelerate's `mixed_precision="bf16"`): the parameters, optimizer
//! and checkpoints stay float32; inside the region, convolutions and matrix products compute in
//! bfloat16 and the losses in float32, by libtorch's own autocast lists.

use std::ffi::c_int;

use tch::Device;

use crate::{Error, Result};

unsafe extern "C" {
    fn lake_autocast_bf16_enter(cuda: c_int) -> c_int;
    fn lake_autocast_exit(cuda: c_int, was: c_int) -> c_int;
}

/// Runs `f` with bfloat16 autocast on for `device`'s type when `enabled`, as a plain call
/// otherwise. Autocast is per thread: `f` runs on the caller's, and the state found is restored
/// after it (also when it was already on).
///
/// # Errors
/// [`Error::Run`] when libtorch refuses to switch autocast.
pub fn bf16_autocast<T>(device: Device, enabled: bool, f: impl FnOnce() -> T) -> Result<T> {
    if !enabled {
        return Ok(f());
    }
    let cuda = c_int::from(device.is_cuda());
    // SAFETY: the shim takes plain integers and catches every C++ exception.
    let was = unsafe { lake_autocast_bf16_enter(cuda) };
    if was < 0 {
        return Err(Error::Run(format!("libtorch refused bfloat16 autocast on {device:?}")));
    }
    // Restores the state when `f` unwinds too.
    struct Exit(c_int, c_int);
    impl Drop for Exit {
        fn drop(&mut self) {
            // SAFETY: as above; a refusal here leaves autocast as libtorch has it.
            let _ = unsafe { lake_autocast_exit(self.0, self.1) };
        }
    }
    let _exit = Exit(cuda, was);
    Ok(f())
}
