//! The generic (non-CPU) code path on burn's wgpu backend, run on Mesa's software Vulkan driver
//! (lavapipe) where there is no GPU: the same burn code as CUDA, so a CPU-only shortcut shows up
//! here. Needs a Vulkan device: `apt-get install -y mesa-vulkan-drivers` on Debian/Ubuntu. The
//! tests every GPU backend runs are in `tests/gpu/`; here those only wgpu has.
#![cfg(feature = "wgpu")]

mod common;
mod gpu;

use gpu::generate_command;
use hacpo::backend::Wgpu as Gpu;

/// The backend's name on the command line (`--device`).
const GPU: &str = "wgpu";

/// wgpu has no bf16: the bf16 cases of `tests/gpu/` are left out.
const HAS_BF16: bool = false;

/// wgpu multiplies f32 in f32.
const TF32_PRODUCTS: bool = false;

/// The wgpu device, or a failure that says what to install (never a silent skip).
fn device() -> burn::backend::wgpu::WgpuDevice {
    let has_vulkan = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d"]
        .iter()
        .any(|d| std::fs::read_dir(d).is_ok_and(|mut e| e.next().is_some()));
    assert!(
        has_vulkan,
        "no Vulkan driver found: the wgpu tests need one; install Mesa's software driver with \
         `apt-get install -y mesa-vulkan-drivers` (Debian/Ubuntu) or run on a machine with a GPU"
    );
    burn::backend::wgpu::WgpuDevice::default()
}

/// bf16 is refused on wgpu from the command line, with what to use instead.
#[test]
fn bf16_is_refused_on_wgpu_from_the_command_line() {
    let _ = device(); // fails with what to install when there is no Vulkan driver
    let dir = common::tiny_model_dir("qwen3-tiny");
    let refused = generate_command(&dir, &["--max-new-tokens", "8", "--device", "wgpu", "--compute-dtype", "bf16"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(err.contains("bf16 is not available on wgpu") && err.contains("use f16"), "{err}");
}

/// On a GPU backend hacpo keeps compiled kernels under `$HACPO_CACHE/kernels/<key>` and says
/// so with `-v`; `HACPO_KERNEL_CACHE=off` turns that off; a malformed cubecl.toml in the working
/// directory is refused with its name before any model loads (cubecl would panic on it).
#[test]
fn gpu_kernels_are_kept_in_hacpos_cache_unless_cubecl_is_configured() {
    let _ = device(); // fails with what to install when there is no Vulkan driver
    let dir = common::tiny_model_dir("qwen3-tiny");
    let (cache, cwd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let generate = |switch: &str| {
        generate_command(&dir, &["--max-new-tokens", "2", "--device", "wgpu", "-v"])
            .current_dir(cwd.path())
            .env("HACPO_CACHE", cache.path())
            .env("HACPO_KERNEL_CACHE", switch)
            .output()
            .unwrap()
    };
    let kept = cache.path().join(format!(
        "kernels/wgpu-burn{}-{:08x}",
        hacpo::backend::kernel_cache::BURN_VERSION,
        hacpo::backend::kernel_cache::kernel_crates_hash() as u32
    ));
    let out = generate("on");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(&format!("GPU kernel cache: {}", kept.display())), "{err}");
    assert!(kept.is_dir());
    let out = generate("off");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("GPU kernels are compiled anew: HACPO_KERNEL_CACHE is off"), "{err}");

    std::fs::write(cwd.path().join("cubecl.toml"), "[compilation\n").unwrap();
    let out = generate("on");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cubecl.toml") && err.contains("fix or remove it"), "{err}");
}

/// Without a Vulkan driver a `--device wgpu` command stops before loading anything, saying what
/// to install (exit 2), instead of the backend's panics in two threads (exit 101).
#[test]
fn a_wgpu_run_without_a_vulkan_driver_says_what_to_install() {
    let dir = common::tiny_model_dir("qwen3-tiny");
    let out = generate_command(&dir, &["--max-new-tokens", "2", "--device", "wgpu"])
        .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
        .env("VK_DRIVER_FILES", "/nonexistent/icd.json")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no usable wgpu device") && err.contains("mesa-vulkan-drivers"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
