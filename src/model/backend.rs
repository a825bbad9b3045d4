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
/// [`GpuTrain`] with the CPU's balanced checkpointing (memory-bound operations recomputed in
/// the backward pass instead of kept: less memory, more kernel launches), chosen at run time
/// by `RLA_PIPE_CUDA_CHECKPOINTING=balanced` so that one binary measures both
/// (`benches/gpu_profile.py`'s `balanced` variant).
#[cfg(feature = "cuda")]
pub type GpuTrainBalanced = burn::backend::Autodiff<
    Gpu,
    burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing,
>;

/// Whether `RLA_PIPE_CUDA_CHECKPOINTING=balanced` asks for [`GpuTrainBalanced`].
#[cfg(feature = "cuda")]
pub fn cuda_balanced() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("RLA_PIPE_CUDA_CHECKPOINTING").is_ok_and(|v| v == "balanced"))
}

/// `x` as a `U`, when `T` is `U`; else `x` back (how the CPU backends' fused operations find
/// their backend's path in generic code: [`on_cpu`], [`super::kv`]).
pub fn cast<T: 'static, U: 'static>(x: T) -> Result<U, T> {
    let x: Box<dyn std::any::Any> = Box::new(x);
    match x.downcast::<U>() {
        Ok(u) => Ok(*u),
        Err(x) => Err(*x.downcast::<T>().expect("the value is a T")),
    }
}

/// `y`, which is a `U` because the value it came from was one ([`cast`] the other way).
pub fn cast_back<T: 'static, U: 'static>(y: T) -> U {
    cast(y).unwrap_or_else(|_| unreachable!("the result has the input's type"))
}

/// A CPU backend tensor's own storage (burn-flex's tensor: buffer and layout), for the fused
/// CPU operations that read or write it in place ([`super::kv`], `hf::attention`, `hf::silu`).
pub fn flex<const D: usize>(x: burn::tensor::Tensor<Cpu, D>) -> burn_flex::FlexTensor {
    x.into_primitive().tensor()
}

/// `x` through the function of its backend: `train` on the CPU training backend, `plain` on the
/// CPU backend, `other` on any other (the fused CPU operations of `model::hf`: the frozen
/// base's products, the masked softmax, the heads' move).
pub fn on_cpu<B: burn::tensor::backend::Backend, const D: usize>(
    x: burn::tensor::Tensor<B, D>,
    train: impl FnOnce(burn::tensor::Tensor<CpuTrain, D>) -> burn::tensor::Tensor<CpuTrain, D>,
    plain: impl FnOnce(burn::tensor::Tensor<Cpu, D>) -> burn::tensor::Tensor<Cpu, D>,
    other: impl FnOnce(burn::tensor::Tensor<B, D>) -> burn::tensor::Tensor<B, D>,
) -> burn::tensor::Tensor<B, D> {
    match cast(x) {
        Ok(x) => cast_back(train(x)),
        Err(x) => match cast(x) {
            Ok(x) => cast_back(plain(x)),
            Err(x) => other(x),
        },
    }
}

/// Whether `B` computes on the GPU (burn-cuda, with or without autodiff: both use its device).
pub fn is_cuda<B: burn::tensor::backend::Backend>() -> bool {
    #[cfg(feature = "cuda")]
    {
        fn device<B: burn::tensor::backend::Backend>() -> std::any::TypeId {
            std::any::TypeId::of::<B::Device>()
        }
        device::<B>() == device::<Gpu>()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

/// Call a backend-generic function on the backend a [`Device`] names:
/// `on_backend!(device, infer | train, function(args...))`, where the function's first
/// argument is the burn device.
#[macro_export]
macro_rules! on_backend {
    ($device:expr, infer, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $device {
            #[cfg(feature = "cuda")]
            $crate::model::Device::Cuda => match $crate::model::backend::cuda_ready() {
                Ok(()) => {
                    let r = $f::<$crate::model::Gpu>(&Default::default(), $($arg),*);
                    $crate::model::backend::release_gpu_memory();
                    r
                }
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
                Ok(()) => {
                    let r = if $crate::model::backend::cuda_balanced() {
                        $f::<$crate::model::backend::GpuTrainBalanced>(&Default::default(), $($arg),*)
                    } else {
                        $f::<$crate::model::GpuTrain>(&Default::default(), $($arg),*)
                    };
                    $crate::model::backend::release_gpu_memory();
                    r
                }
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
                configure_cuda();
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

/// Hand the GPU's unused memory pages back once a model call is over (its tensors are
/// dropped by then): cubecl's pools keep every page they allocated, sized for the shapes they
/// served, so without this each stage would start with the last one's peak reserved.
#[cfg(feature = "cuda")]
pub fn release_gpu_memory() {
    use burn::tensor::backend::Backend;
    super::device_memory::note_gpu_reserved::<Gpu>();
    Gpu::memory_cleanup(&Default::default());
}

/// Where compiled GPU kernels are kept between runs: `RLA_PIPE_KERNEL_CACHE` (a directory, or
/// `off`), by default `$XDG_CACHE_HOME/rla-pipe/kernels` (`~/.cache/rla-pipe/kernels`).
#[cfg(feature = "cuda")]
pub fn kernel_cache_dir() -> Option<std::path::PathBuf> {
    kernel_cache_dir_from(
        std::env::var_os("RLA_PIPE_KERNEL_CACHE"),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn kernel_cache_dir_from(
    var: Option<std::ffi::OsString>,
    xdg: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    match var {
        Some(v) if v == "off" || v == "0" || v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => xdg
            .filter(|x| !x.is_empty())
            .map(PathBuf::from)
            .or_else(|| home.map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("rla-pipe").join("kernels")),
    }
}

/// cubecl's configuration, set once before the first kernel: whatever a `cubecl.toml` (or
/// `burn.toml`) in the working directory or above and the `CUBECL_*` variables say, plus the
/// on-disk cache of compiled kernels ([`kernel_cache_dir`]) unless they name a cache
/// themselves. Without the cache every process compiles each kernel it launches (NVRTC) at its
/// first use; with it, a later run loads them.
#[cfg(feature = "cuda")]
fn configure_cuda() {
    use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig, cache::CacheConfig};
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    if config.compilation.cache.is_none() {
        config.compilation.cache = kernel_cache_dir().map(CacheConfig::File);
    }
    // `set` panics once something has read the configuration: set it only before that.
    let unset = CubeClRuntimeConfig::storage().lock().is_none();
    if unset {
        CubeClRuntimeConfig::set(config);
    }
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

#[cfg(test)]
mod tests {
    use super::kernel_cache_dir_from;
    use std::path::PathBuf;

    #[test]
    fn kernel_cache_follows_the_variable_then_xdg_then_home() {
        let os = |s: &str| Some(std::ffi::OsString::from(s));
        assert_eq!(kernel_cache_dir_from(os("off"), os("/x"), os("/h")), None);
        assert_eq!(kernel_cache_dir_from(os(""), None, os("/h")), None);
        assert_eq!(
            kernel_cache_dir_from(os("/k"), os("/x"), os("/h")),
            Some(PathBuf::from("/k"))
        );
        assert_eq!(
            kernel_cache_dir_from(None, os("/x"), os("/h")),
            Some(PathBuf::from("/x/rla-pipe/kernels"))
        );
        assert_eq!(
            kernel_cache_dir_from(None, None, os("/h")),
            Some(PathBuf::from("/h/.cache/rla-pipe/kernels"))
        );
        assert_eq!(kernel_cache_dir_from(None, None, None), None);
    }
}
