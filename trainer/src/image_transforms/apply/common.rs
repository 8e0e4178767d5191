//! What the transforms' implementations share: host values on the frames' device, factors per
//! row.

use tch::{Device, Tensor};

/// A tensor made on the host, on `device`: to a GPU from pinned memory without blocking, so that
/// the task making the next batch does not wait for the step the GPU is running (a copy from
/// pageable memory waits for the stream's queued work).
pub(crate) fn upload(t: Tensor, device: Device) -> Tensor {
    match device {
        Device::Cpu => t,
        _ => t.pin_memory(device).to_device_(device, t.kind(), true, false),
    }
}

/// One value per row of `like`, shaped to broadcast over its other dimensions.
pub(crate) fn per_row(values: &[f64], like: &Tensor) -> Tensor {
    let mut shape = vec![values.len() as i64];
    shape.resize(like.dim(), 1);
    let values: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    upload(Tensor::from_slice(&values), like.device()).view(shape.as_slice())
}

/// `x` with each row multiplied by its value (a single row by a scalar, libtorch's faster path;
/// either way in float32).
pub(crate) fn times(x: &Tensor, values: &[f64]) -> Tensor {
    match values {
        [v] => x * *v,
        _ => x * per_row(values, x),
    }
}

/// The end of a transform handed another transform's draws: the rows of a group hold the draws of
/// the transform the group applies.
pub(crate) fn mismatch(draw: &dyn std::fmt::Debug) -> ! {
    unreachable!("a transform's rows hold that transform's draws, not {draw:?}")
}

/// `acc + x·alpha` with each row's `alpha`, as torchvision's `acc.add_(x, alpha=…)` computes it:
/// through libtorch's `addcmul`, whose multiply and add libtorch fuses where it fuses that
/// add's (the tests hold lake's transforms to torchvision's on this libtorch).
pub(crate) fn fused(acc: &Tensor, x: &Tensor, alphas: &[f64]) -> Tensor {
    acc.addcmul(x, &per_row(alphas, x))
}
