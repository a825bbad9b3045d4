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
            $crate::model::Device::Cuda => match $crate::model::backend::cuda_ready() {
                Ok(()) => $f::<$crate::model::Gpu>(&Default::default(), $($arg),*),
                Err(e) => Err(e),
            },
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
            $crate::model::Device::Cuda => match $crate::model::backend::cuda_ready() {
                Ok(()) => $f::<$crate::model::GpuTrain>(&Default::default(), $($arg),*),
                Err(e) => Err(e),
            },
            #[cfg(feature = "ndarray")]
            $crate::model::Device::Ndarray => $f::<burn::backend::Autodiff<burn::backend::NdArray>>(&Default::default(), $($arg),*),
            $crate::model::Device::Cpu => $f::<$crate::model::CpuTrain>(&Default::default(), $($arg),*),
            #[allow(unreachable_patterns)]
            other => Err($crate::model::unavailable(other)),
        }
    };
}

/// Whether CUDA works here: the first call moves one number to the GPU and back, and every
/// later call returns that answer. Without it, a machine with no NVIDIA driver or GPU (or no
/// NVRTC) fails inside burn-cuda's device thread with a panic; this turns that into an error
/// naming `run.device` and the cause, and a non-zero exit.
#[cfg(feature = "cuda")]
pub fn cuda_ready() -> Result<(), Error> {
    use std::sync::{Mutex, OnceLock};
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            // burn-cuda panics (in its device thread, then in ours) when CUDA is missing: keep
            // the first message and silence the hook while probing.
            let cause: &'static Mutex<Option<String>> = Box::leak(Box::new(Mutex::new(None)));
            let hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                let mut c = cause.lock().unwrap_or_else(|p| p.into_inner());
                if c.is_none() {
                    let msg = info
                        .payload()
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "unknown".into());
                    *c = Some(msg);
                }
            }));
            let probe = std::panic::catch_unwind(|| {
                let t = burn::tensor::Tensor::<Gpu, 1>::from_floats([1.0f32], &Default::default());
                t.into_data().to_vec::<f32>().ok() == Some(vec![1.0])
            });
            std::panic::set_hook(hook);
            match probe {
                Ok(true) => Ok(()),
                Ok(false) => Err("a value sent to the GPU came back changed".into()),
                Err(_) => Err(cause
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .unwrap_or_else(|| "unknown".into())),
            }
        })
        .clone()
        .map_err(|cause| {
            Error::Config(format!(
                "key `run.device`: \"cuda\" is not usable on this machine (no NVIDIA GPU, driver \
                 or NVRTC found?): {cause}"
            ))
        })
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
