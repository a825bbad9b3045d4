//! The burn backends a model runs on: CPU through burn's `flex` backend (the default,
//! bit-reproducible), CUDA behind the cargo feature `cuda`, and [`on_backend!`](crate::on_backend),
//! which picks one at run time from a [`Device`].

use super::config::Device;
use crate::error::Error;

/// The CPU backend.
pub type Cpu = burn::backend::Flex;
/// The CPU backend with autodiff (training). Balanced checkpointing: the backward pass
/// recomputes what memory-bound operations (element-wise, normalisation) produced instead of
/// keeping it from the forward pass, with the same kernels, so the gradients are the same to
/// the last bit and a pretrained model's autodiff graph holds mostly matrix products' inputs
/// (docs/src/real-models.md#memory).
pub type CpuTrain = burn::backend::Autodiff<
    Cpu,
    burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing,
>;
/// The CUDA backend.
#[cfg(feature = "cuda")]
pub type Gpu = burn::backend::Cuda;
/// The CUDA backend with autodiff (training).
#[cfg(feature = "cuda")]
pub type GpuTrain = burn::backend::Autodiff<Gpu>;

/// Call a backend-generic function on the backend a [`Device`] names:
/// `on_backend!(device, infer | train, function(args...))`, where the function's first
/// argument is the burn device.
#[macro_export]
macro_rules! on_backend {
    ($device:expr, infer, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $device {
            #[cfg(feature = "cuda")]
            $crate::model::Device::Cuda => $f::<$crate::model::Gpu>(&Default::default(), $($arg),*),
            #[cfg(feature = "ndarray")]
            $crate::model::Device::Ndarray => $f::<burn::backend::NdArray>(&Default::default(), $($arg),*),
            $crate::model::Device::Cpu => $f::<$crate::model::Cpu>(&Default::default(), $($arg),*),
            #[allow(unreachable_patterns)]
            other => Err($crate::model::unavailable(other)),
        }
    };
    ($device:expr, train, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $device {
            #[cfg(feature = "cuda")]
            $crate::model::Device::Cuda => $f::<$crate::model::GpuTrain>(&Default::default(), $($arg),*),
            #[cfg(feature = "ndarray")]
            $crate::model::Device::Ndarray => $f::<burn::backend::Autodiff<burn::backend::NdArray>>(&Default::default(), $($arg),*),
            $crate::model::Device::Cpu => $f::<$crate::model::CpuTrain>(&Default::default(), $($arg),*),
            #[allow(unreachable_patterns)]
            other => Err($crate::model::unavailable(other)),
        }
    };
}

/// The error for a device this build has no backend for.
pub fn unavailable(device: Device) -> Error {
    Error::Config(format!(
        "key `run.device`: {device:?} is not available in this build (cpu{})",
        if cfg!(feature = "cuda") {
            ", cuda"
        } else {
            "; rebuild with --features cuda for cuda"
        }
    ))
}
