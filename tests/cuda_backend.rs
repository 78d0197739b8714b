//! The tests every GPU backend runs (`tests/gpu/`) on burn's CUDA backend: built with `--features
//! cuda` (`CUDARC_CUDA_VERSION` names the toolkit's version when no toolkit is installed where it
//! builds), run where `nvidia-smi` lists a GPU and `CUDA_PATH` names a CUDA toolkit (NVRTC
//! compiles the kernels). Without those the tests fail and say so; without the feature there is
//! nothing here (CI's machines have no NVIDIA GPU).
#![cfg(feature = "cuda")]

mod common;
mod gpu;

use hacpo::backend::Cuda as Gpu;

/// The backend's name on the command line (`--device`).
const GPU: &str = "cuda";

/// CUDA runs bf16: `tests/gpu/` adds its bf16 cases.
const HAS_BF16: bool = true;

/// CUDA multiplies f32 in TF32: cubek's matmul rounds f32 operands to 10-bit mantissas for the
/// tensor cores (`cubek-matmul`'s `adjust_dtypes`), as PyTorch does with `allow_tf32`.
const TF32_PRODUCTS: bool = true;

/// The first CUDA device, once checked to run a kernel; a failure says what is missing.
fn device() -> burn::backend::cuda::CudaDevice {
    static STARTED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let device = burn::backend::cuda::CudaDevice::default();
    let started = STARTED.get_or_init(|| {
        hacpo::backend::device_check::start::<Gpu>(hacpo::backend::DeviceSpec::Cuda(0), &device)
            .map_err(|e| e.to_string())
    });
    if let Err(why) = started {
        panic!("{why}");
    }
    device
}
