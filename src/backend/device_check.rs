//! A GPU device's start, before a command loads anything onto it: where compiled kernels are
//! kept ([`super::kernel_cache`]), then one kernel.
//!
//! burn's GPU backends start a device on its first operation and panic when they cannot: no
//! Vulkan driver (wgpu), no NVIDIA driver, no visible GPU or no NVRTC (CUDA), often in a server
//! thread of their own, with a backtrace and exit code 101. One small kernel (a fill, read back)
//! meets each of these first; the panic's message becomes an error that says what to install.

use std::panic::AssertUnwindSafe;
use std::sync::Mutex;

use burn::tensor::{Tensor, backend::Backend};

use super::DeviceSpec;
use crate::error::{Error, Result};

/// Sets the kernel cache (`device` is only named so far: burn starts it on its first op), then
/// runs one kernel on `device` and reads its result back; a panic on the way is an error naming
/// `spec` and what to check.
pub fn start<B: Backend>(spec: DeviceSpec, device: &B::Device) -> Result<()> {
    super::kernel_cache::prepare(spec)?;
    static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let previous = std::panic::take_hook();
    // Every thread's panic message, kept instead of printed (the device's server thread panics
    // first; the caller then panics on the closed channel).
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        PANICS.lock().unwrap_or_else(|e| e.into_inner()).push(message);
    }));
    let ran = std::panic::catch_unwind(AssertUnwindSafe(|| Tensor::<B, 1>::zeros([1], device).into_data()));
    std::panic::set_hook(previous);
    if ran.is_ok() {
        return Ok(());
    }
    let panics = std::mem::take(&mut *PANICS.lock().unwrap_or_else(|e| e.into_inner()));
    let why = panics.first().map(|m| m.lines().next().unwrap_or_default().to_string()).unwrap_or_default();
    let fix = match spec {
        DeviceSpec::Wgpu => {
            "install a Vulkan driver (without a GPU, Mesa's lavapipe: apt-get install mesa-vulkan-drivers), \
             or use --device cpu"
        }
        _ => {
            "check that nvidia-smi lists the GPU, that the NVIDIA driver is installed and that CUDA_PATH \
             names a CUDA toolkit (NVRTC compiles the kernels), or use --device cpu"
        }
    };
    Err(Error::InvalidArgument(format!("no usable {spec} device: it could not run a kernel ({why}); {fix}")))
}
