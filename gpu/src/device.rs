//! One GPU: its primary context (the one libtorch's CUDA runtime uses too), its default stream,
//! and lake's kernels, compiled by NVRTC once per process and loaded once per device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::{CompileOptions, Ptx};

use crate::colour::{ENTRY, Geometry, Matrix, Target};
use crate::resize::{COLUMNS_ENTRY, ROWS_ENTRY, Resize};
use crate::{Error, Result};

/// A GPU with lake's kernels loaded.
pub struct Gpu {
    pub(crate) context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    colour: CudaFunction,
    rows: CudaFunction,
    columns: CudaFunction,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("ordinal", &self.context.ordinal()).finish_non_exhaustive()
    }
}

impl Gpu {
    /// Opens GPU `ordinal` (CUDA's numbering) and loads lake's kernels on it.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when this machine has no CUDA driver, no such device, or no
    /// NVRTC; [`Error::Compile`] or [`Error::Driver`] when the kernels cannot be made.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        // SAFETY: the probe only tries to load the driver library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::Unavailable("no CUDA driver library (libcuda.so) on this machine".to_owned()));
        }
        let count = CudaContext::device_count().map_err(|e| Error::Unavailable(format!("the CUDA driver found no device: {e}")))?;
        if ordinal >= usize::try_from(count).unwrap_or(0) {
            return Err(Error::Unavailable(format!("CUDA device {ordinal} asked for; this machine has {count}")));
        }
        let context = CudaContext::new(ordinal)?;
        let module = module_for(&context)?;
        let colour = module.load_function(ENTRY)?;
        let (rows, columns) = (module.load_function(ROWS_ENTRY)?, module.load_function(COLUMNS_ENTRY)?);
        Ok(Gpu { stream: context.default_stream(), context, colour, rows, columns })
    }

    /// The device's CUDA ordinal.
    pub fn ordinal(&self) -> usize {
        self.context.ordinal()
    }

    /// The device's name, as the driver gives it.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver does not answer.
    pub fn name(&self) -> Result<String> {
        Ok(self.context.name()?)
    }

    /// Waits until every launch queued on this GPU's stream has finished.
    ///
    /// # Errors
    /// [`Error::Driver`] when one of them failed.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    /// The stream lake's launches go to: the device's legacy default stream, which libtorch's
    /// default stream is too, so a launch is ordered with the tensor operations around it.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl Gpu {
    /// Converts a batch on this GPU in one launch on its stream: the frames at the device
    /// addresses `frames` (each as `geometry` says), with `matrix` (of the layout's bit depth),
    /// into the device buffer `out`
    /// (at least [`Target::bytes`] long), which may be a tensor's storage. Returns once the
    /// launch is queued; work queued after it on the same stream sees its result.
    ///
    /// # Safety
    /// Every address in `frames` must point to device memory of this GPU holding at least
    /// [`Layout::frame_bytes`](crate::colour::Layout::frame_bytes) bytes, and `out` to device memory of at least
    /// [`Target::bytes`] bytes that nothing else uses until the launch completes.
    ///
    /// # Errors
    /// [`Error::Layout`] for sizes that do not fit or a matrix of another bit depth,
    /// [`Error::Driver`] when the launch fails.
    pub unsafe fn convert<M: Into<Matrix> + Copy>(
        &self,
        frames: &[u64],
        geometry: Geometry,
        matrix: &M,
        target: Target,
        out: u64,
    ) -> Result<()> {
        use cudarc::driver::{LaunchConfig, PushKernelArg as _};

        geometry.check()?;
        let Geometry { width, height, layout } = geometry;
        let [y_term, y_gain, v_to_r, u_to_g, v_to_g, u_to_b] = (*matrix).into().for_layout(layout)?;
        if frames.is_empty() {
            return Ok(());
        }
        let threads = u64::from(width) * u64::from(height) * frames.len() as u64;
        let blocks = u32::try_from(threads.div_ceil(256)).map_err(|_| Error::Layout(format!("{threads} pixels in one batch")))?;
        let table = self.stream().clone_htod(frames)?;
        let (count, w, h) = (frames.len() as i32, width as i32, height as i32);
        let (code, pitch, uv_offset) = layout.code(width);
        let pitch = pitch as i32;
        let (kind, mean, std) = target.code();
        let function = &self.colour;
        let mut launch = self.stream().launch_builder(function);
        launch.arg(&table).arg(&count).arg(&w).arg(&h).arg(&code).arg(&pitch).arg(&uv_offset);
        launch.arg(&y_term).arg(&y_gain).arg(&v_to_r).arg(&u_to_g).arg(&v_to_g).arg(&u_to_b);
        launch.arg(&kind).arg(&out);
        launch.arg(&mean[0]).arg(&mean[1]).arg(&mean[2]).arg(&std[0]).arg(&std[1]).arg(&std[2]);
        let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match the kernel's parameters in order and type; the caller
        // vouches for the addresses (see above). `table` lives until the launch has read it:
        // its drop waits on the stream.
        unsafe { launch.launch(config) }?;
        Ok(())
    }
}

impl Gpu {
    /// Resizes a batch of RGB24 frames on this GPU as the frame tables resize them, in two
    /// launches on its stream: the frames at the device addresses `frames` (each of
    /// [`Resize::from`]'s size), into the device buffer `out` (at least [`Target::bytes`] of
    /// [`Resize::to`]'s size long, which may be a tensor's storage) as `target` asks. Returns once
    /// the launches are queued; work queued after them on the same stream sees their result.
    ///
    /// # Safety
    /// Every address in `frames` must point to device memory of this GPU holding a whole RGB24
    /// frame of the resize's source size, and `out` to device memory of at least
    /// [`Target::bytes`] bytes that nothing else uses until the launches complete.
    ///
    /// # Errors
    /// [`Error::Layout`] for a batch too large for one launch, [`Error::Driver`] when a launch
    /// fails.
    pub unsafe fn resize(&self, frames: &[u64], resize: &Resize, target: Target, out: u64) -> Result<()> {
        use cudarc::driver::{LaunchConfig, PushKernelArg as _};

        if frames.is_empty() {
            return Ok(());
        }
        let ((src_w, src_h), (dst_w, dst_h)) = (resize.from(), resize.to());
        let blocks =
            |threads: u64| u32::try_from(threads.div_ceil(256)).map_err(|_| Error::Layout(format!("{threads} samples in one batch")));
        let rows_blocks = blocks(u64::from(src_h) * u64::from(dst_w) * frames.len() as u64)?;
        let columns_blocks = blocks(u64::from(dst_h) * u64::from(dst_w) * frames.len() as u64)?;
        let stream = self.stream();
        let table = stream.clone_htod(frames)?;
        let params = stream.clone_htod(&resize.params()[..])?;
        let [luma, chroma, columns] = resize.filters();
        let upload = |f: &crate::resize::AreaFilter| -> Result<_> {
            Ok((stream.clone_htod(&f.positions[..])?, stream.clone_htod(&f.coefficients[..])?, f.taps as i32))
        };
        let ((luma_at, luma_c, luma_taps), (chroma_at, chroma_c, chroma_taps)) = (upload(luma)?, upload(chroma)?);
        let (columns_at, columns_c, columns_taps) = upload(columns)?;
        let scratch = stream.alloc_zeros::<i16>(resize.scratch_samples(frames.len()))?;
        let (count, pairs) = (frames.len() as i32, i32::from(resize.pairs()));
        let (sw, sh, dw, dh) = (src_w as i32, src_h as i32, dst_w as i32, dst_h as i32);
        let mut launch = stream.launch_builder(&self.rows);
        launch.arg(&table).arg(&count).arg(&sw).arg(&sh).arg(&dw).arg(&pairs).arg(&params);
        launch.arg(&luma_at).arg(&luma_c).arg(&luma_taps).arg(&chroma_at).arg(&chroma_c).arg(&chroma_taps);
        launch.arg(&scratch);
        let config = |blocks: u32| LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match the rows kernel's parameters in order and type; the
        // caller vouches for the frames; the scratch holds every frame's three planes of source
        // rows by output columns.
        unsafe { launch.launch(config(rows_blocks)) }?;
        let (kind, mean, std) = target.code();
        let mut launch = stream.launch_builder(&self.columns);
        launch.arg(&scratch).arg(&count).arg(&sh).arg(&dw).arg(&dh).arg(&params);
        launch.arg(&columns_at).arg(&columns_c).arg(&columns_taps).arg(&kind).arg(&out);
        launch.arg(&mean[0]).arg(&mean[1]).arg(&mean[2]).arg(&std[0]).arg(&std[1]).arg(&std[2]);
        // SAFETY: the arguments match the columns kernel's parameters in order and type; the
        // caller vouches for `out`. The uploads and the scratch live until the launches have
        // read them: their drops wait on the stream.
        unsafe { launch.launch(config(columns_blocks)) }?;
        Ok(())
    }
}

/// The kernels' PTX, compiled once per process by NVRTC for no particular device (the driver
/// finishes it for each device on loading).
///
/// # Errors
/// [`Error::Unavailable`] when NVRTC cannot be loaded, [`Error::Compile`] with its log when it
/// refuses the source.
pub fn compile_kernels() -> Result<String> {
    static PTX: OnceLock<Result<String, Error>> = OnceLock::new();
    let compiled = PTX.get_or_init(|| {
        nvrtc_version().ok_or_else(|| Error::Unavailable("no NVRTC library (libnvrtc.so) on this machine".to_owned()))?;
        let options = CompileOptions {
            // The twin rounds each multiply and add on its own: no contraction into fused ones,
            // IEEE division, denormals kept.
            fmad: Some(false),
            prec_div: Some(true),
            ftz: Some(false),
            name: Some("lake_kernels.cu".to_owned()),
            ..Default::default()
        };
        let source = [crate::colour::KERNELS, crate::resize::KERNELS].concat();
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, options).map_err(|e| match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => Error::Compile(log.to_string_lossy().into_owned()),
            other => Error::Compile(other.to_string()),
        })?;
        Ok(ptx.to_src())
    });
    match compiled {
        Ok(ptx) => Ok(ptx.clone()),
        Err(Error::Unavailable(m)) => Err(Error::Unavailable(m.clone())),
        Err(e) => Err(Error::Compile(e.to_string())),
    }
}

/// NVRTC's version, `None` when no NVRTC library can be loaded.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    // SAFETY: the probe only tries to load the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is loaded; the call writes two ints.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (status == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// The kernels' module on `context`'s device, loaded once per device.
fn module_for(context: &Arc<CudaContext>) -> Result<Arc<CudaModule>> {
    static MODULES: OnceLock<Mutex<HashMap<usize, Arc<CudaModule>>>> = OnceLock::new();
    let modules = MODULES.get_or_init(Default::default);
    let mut modules = modules.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(module) = modules.get(&context.ordinal()) {
        return Ok(module.clone());
    }
    let module = context.load_module(Ptx::from_src(compile_kernels()?))?;
    modules.insert(context.ordinal(), module.clone());
    Ok(module)
}

#[cfg(test)]
#[allow(clippy::print_stderr)]
mod tests {
    /// NVRTC compiles the kernels where it is found (the torch stage of `scripts/test.sh` puts
    /// the torch wheel's NVRTC on the library path and sets LAKE_REQUIRE_NVRTC=1, so CI always
    /// compiles them). The PTX has the entry point and no fused multiply-add.
    #[test]
    fn nvrtc_compiles_the_kernels_without_fused_multiply_adds() {
        let required = std::env::var("LAKE_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        match super::compile_kernels() {
            Ok(ptx) => {
                for entry in ["lake_yuv_to_rgb", "lake_area_rows", "lake_area_columns"] {
                    assert!(ptx.contains(&format!(".entry {entry}")), "no entry point {entry} in:\n{ptx}");
                }
                assert!(!ptx.contains("fma."), "a fused multiply-add in:\n{ptx}");
                // bfloat16 rounding is integer work on the float's bits, not a conversion.
                assert!(!ptx.contains("bf16"), "a bfloat16 instruction in:\n{ptx}");
                eprintln!("NVRTC {:?} compiled the kernels: {} bytes of PTX", super::nvrtc_version(), ptx.len());
            }
            Err(crate::Error::Unavailable(why)) if !required => eprintln!("skipped: {why}"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_machine_without_a_gpu_says_so() {
        // SAFETY: the probe only tries to load the driver library.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            eprintln!("skipped: this machine has a CUDA driver");
            return;
        }
        let refused = super::Gpu::open(0).expect_err("no driver here");
        assert!(matches!(refused, crate::Error::Unavailable(_)), "{refused}");
        assert!(refused.to_string().contains("no CUDA driver library"), "{refused}");
    }
}
