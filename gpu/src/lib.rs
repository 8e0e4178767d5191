//! CUDA for lake, through cudarc with the driver, NVRTC and NCCL loaded at run time: a binary
//! built on a machine without a CUDA toolkit runs everywhere, and says plainly when there is no
//! GPU, driver or NVRTC rather than failing at start.
//!
//! # Crate tour
//! - [`colour`]: YUV 4:2:0 → RGB for a whole batch in one launch, from lake's packed `yuv420p`
//!   planes, NVDEC's NV12 surfaces, or their 10-bit kin (`yuv420p10le` planes, P010 surfaces),
//!   to RGB24 (HWC, the loader's layout) or normalised float32 or bfloat16 CHW, written straight
//!   into the caller's device buffer (a trainer's input tensor). The arithmetic is libswscale's
//!   fixed point ([`lake_codec::YuvToRgb`], [`colour::YuvToRgb10`]), so GPU frames equal the
//!   CPU path's, and LeRobot's, byte for byte. Its CPU twin,
//!   [`colour::convert_on_cpu`], is the specification: the same operations in the same order.
//! - [`resize`]: RGB24 frames resized on the GPU as lake's frame tables resize them (libswscale's
//!   area averaging, through its YUV pipeline), to the bit, in two launches a batch; its CPU
//!   twin, [`resize::resize_on_cpu`], is the specification.
//! - [`Gpu`]: one device's context, its stream, and the kernels compiled once per process by
//!   NVRTC and loaded once per device.
//! - [`check`]: what the machine has (driver, devices, NVRTC, NCCL, NVDEC), and the colour
//!   kernel run on a device against its twin.
//! - [`nvdec`]: what the GPU's video decode engine decodes, asked of the device per codec, bit
//!   depth and size.
//! - [`nccl`]: NCCL for data-parallel ranks, loaded by the names its packages install.
//!
//! Kernels are compiled with `--fmad=false`: CUDA would otherwise contract a multiply and an add
//! into one fused operation, rounding once where the twin rounds twice. The tests also build the
//! kernels' CUDA source for the CPU and run it thread by thread against the twins, so that a
//! machine without a GPU runs the code the GPU would run.

pub mod check;
pub mod colour;
mod device;
mod error;
#[cfg(test)]
mod kernels_on_host;
pub mod nccl;
pub mod nvdec;
pub mod resize;

pub use device::{Gpu, compile_kernels, nvrtc_version};
pub use error::{Error, Result};
pub use lake_codec::YuvToRgb;

/// The dynamic loader's own words for a library or symbol that did not load (libloading's
/// `Display` keeps them in the error's source).
pub(crate) fn loader_error(e: &libloading::Error) -> String {
    std::error::Error::source(e).map_or_else(|| e.to_string(), ToString::to_string)
}
