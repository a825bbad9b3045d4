//! How much GPU memory the models' work reserved at its peak (`stage_runs.peak_device_bytes`):
//! cubecl's pools keep the pages a model call or optimizer step reserved until
//! `backend::release_gpu_memory` (or the update's own cleanup)
//! hands the unused ones back, so the reservation read just before that is the call's peak.
//! Nothing here on the CPU backends. A file of its own below `backend` and `ppo`, which both
//! note the peak before they hand pages back.

use std::sync::atomic::{AtomicU64, Ordering};

/// The largest reservation noted since the last [`take_device_peak`] (bytes); 0 = none seen.
static DEVICE_PEAK: AtomicU64 = AtomicU64::new(0);

/// Fold `bytes` into [`DEVICE_PEAK`].
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn note_device_peak(bytes: u64) {
    DEVICE_PEAK.fetch_max(bytes, Ordering::Relaxed);
}

/// Note the GPU's reserved memory now when `B` computes on the GPU (cubecl's memory usage: in
/// use, padding and pool pages kept for later allocations); nothing on the CPU.
pub fn note_gpu_reserved<B: burn::tensor::backend::Backend>() {
    #[cfg(feature = "cuda")]
    {
        use burn::cubecl::cuda::CudaRuntime;
        use cubecl_runtime::runtime::Runtime;
        type Gpu = burn::backend::cuda::CudaDevice;
        if std::any::TypeId::of::<B::Device>() == std::any::TypeId::of::<Gpu>() {
            if let Ok(usage) = CudaRuntime::client(&Gpu::default()).memory_usage() {
                note_device_peak(usage.bytes_reserved);
            }
        }
    }
}

/// The peak device memory noted since the last call (`None` when no device call was), and
/// start counting afresh: a stage's `stage_runs.peak_device_bytes`.
pub fn take_device_peak() -> Option<u64> {
    match DEVICE_PEAK.swap(0, Ordering::Relaxed) {
        0 => None,
        bytes => Some(bytes),
    }
}

#[cfg(test)]
mod tests {
    /// The peak is the largest noted since the last take, and a take starts afresh.
    #[test]
    fn the_peak_is_the_largest_since_the_last_take() {
        super::take_device_peak();
        assert_eq!(super::take_device_peak(), None);
        for bytes in [3, 9, 4] {
            super::note_device_peak(bytes);
        }
        assert_eq!(super::take_device_peak(), Some(9));
        assert_eq!(super::take_device_peak(), None);
    }
}
