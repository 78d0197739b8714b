//! Compute backends and device selection.
//!
//! Everything model-related is generic over `B: burn::tensor::backend::Backend`; this module
//! names the concrete backends hacpo ships (CPU `flex` always, CUDA with `--features cuda`,
//! wgpu with `--features wgpu`)
//! and turns a `--device` string into one of them. Commands dispatch once at the top with
//! [`with_backend!`](crate::with_backend) and stay generic below.

pub mod attention;
pub mod bf16_matmul;
pub mod bf16_panels;
pub(crate) mod bf16_trained;
pub mod cast;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub mod cube_fused;
pub mod device_check;
pub mod f32_matmul;
pub mod flex_fast;
pub mod fused;
pub mod gather;
pub mod kernel_cache;
pub mod kernels;
pub mod packed_attention;
pub mod packed_weight;
mod panel_split;
mod parallel_fill;
pub(crate) mod primitive;
pub mod reduce;

use crate::error::{Error, Result};

/// Whether hacpo's GPU kernels run `B`'s inference ops (a plain CUDA or wgpu backend, the
/// kernels on): they read any float dtype, so the products around them may stay in half
/// precision instead of being widened to f32 and rounded back (a launch each way).
pub fn gpu_kernels<B: burn::tensor::backend::Backend>() -> bool {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        cube_fused::on_gpu::<B>()
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        false
    }
}

/// Whether products in `compute` may return half precision as it is (no widening to f32):
/// a half-precision compute dtype on a backend where [`gpu_kernels`] read it.
pub fn keeps_half<B: burn::tensor::backend::Backend>(compute: crate::dtype::ComputeDtype) -> bool {
    compute != crate::dtype::ComputeDtype::F32 && gpu_kernels::<B>()
}

/// Runs `work` on device stream `lane` of the GPU backends (a no-op on the CPU).
///
/// burn's GPU backends (cubecl) give every thread its own stream, and every stream its own
/// memory pool, whose pages are reused only by that stream's next allocations. Work that runs
/// per policy in threads started for the step (the exchange's rollouts, scoring, concurrent
/// updates, validation: `policy::per_policy`) would, on the threads' own streams, leave full
/// pools behind until the 128 stream slots all held a step's peak (the embedded default ran
/// out of an H100's 80 GB at step 17 of 40). One lane per policy keeps one pool per policy,
/// reused every step; work on the main thread keeps the main thread's stream.
pub fn on_lane<R>(lane: usize, work: impl FnOnce() -> R) -> R {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        // Lanes 64, 65, …: apart from the main thread's stream (the first id handed out). A
        // worker thread draws an id of its own too, but never allocates on it.
        cubecl_common::stream_id::StreamId { value: 64 + lane as u64 }.executes(work)
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = lane;
        work()
    }
}

/// Runs `work` on one of rayon's worker threads when `B` is the plain CPU backend (elsewhere,
/// autodiff included, on a worker already, and with the fast paths off for a test, where it
/// is called).
///
/// The CPU backend splits each op over rayon's threads. Called from a thread outside the
/// pool, each op hands its tasks to the pool and sleeps until they are done: two context
/// switches per op, which decoding one sequence (a few hundred small products per token)
/// paid on every op. On a worker, an op's first task runs on the calling thread while the
/// other workers take the rest. GPU backends keep the caller's thread: their streams, and
/// memory pools, are per thread ([`on_lane`]).
///
/// Inference only (sampling, scoring); training goes through [`training_on_a_cpu_worker`].
/// Measured on a 2-core AMD EPYC Zen 4 (SmolLM2-135M in bf16, against the same build from the
/// caller's thread): sampling one sequence 1.4–1.7×.
pub fn on_a_cpu_worker<B: burn::tensor::backend::Backend, R: Send>(work: impl FnOnce() -> R + Send) -> R {
    if !worker_helps::<B>() {
        return work();
    }
    // The caller's span stays the parent of the work's spans (progress and logs follow it).
    let span = tracing::Span::current();
    rayon::scope(move |_| span.in_scope(work))
}

/// [`on_a_cpu_worker`] for a training pass (a policy's whole update): on a worker of a pool
/// of its own, one pass at a time.
///
/// A worker waiting inside an op runs other queued work of its pool on the same thread, and
/// burn's autodiff locks a pass's graph through its backward and, at its end, every graph in
/// turn. A pass picked up under another pass, or under a piece of an op that a backward on
/// another thread waits for, would wait for a lock held below it on its own stack. So training
/// passes get a pool that no other work enters, and a caller waits outside it while another
/// pass is in it. The pool has as many threads as rayon's, which sleep while it works (the
/// stages take turns), and a main thread's stack.
///
/// Measured on a 2-core AMD EPYC Zen 5 (a GRPO update of 32 SmolLM2-135M sequences in bf16,
/// against the same build from the caller's thread): 5% faster (1% on a Zen 4's train step).
pub fn training_on_a_cpu_worker<B: burn::tensor::backend::Backend, R: Send>(work: impl FnOnce() -> R + Send) -> R {
    static ONE_PASS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    // Checked first: a GPU run, or a test with the fast paths off, starts no threads here.
    if !worker_helps::<B>() {
        return work();
    }
    let pool = POOL.get_or_init(|| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(rayon::current_num_threads())
            .stack_size(8 << 20)
            .thread_name(|i| format!("{TRAINING_THREAD}{i}"));
        pool.build().ok()
    });
    let Some(pool) = pool.as_ref() else {
        return work();
    };
    // Held until the pass is done; one that panicked leaves nothing to protect.
    let _alone = ONE_PASS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let span = tracing::Span::current();
    pool.install(move || span.in_scope(work))
}

/// The name of [`training_on_a_cpu_worker`]'s threads, before their index.
const TRAINING_THREAD: &str = "hacpo-training-";

/// Whether work of backend `B` called here gains from moving to a worker: on the plain CPU
/// backend, from a thread outside the pools (on one already, and with the fast paths off
/// for a test, it runs where it is called).
fn worker_helps<B: burn::tensor::backend::Backend>() -> bool {
    // `cpu_backend` also says no while a test has the fast paths off.
    let plain_cpu = fused::cpu_backend::<B>(&[]) == Some(fused::CpuBackend::Plain);
    rayon::current_thread_index().is_none() && plain_cpu
}

/// The CPU backend (burn-flex: pure Rust, gemm-based matmul, rayon threads).
pub type Cpu = burn::backend::Flex;
/// The CPU backend with autodiff, for training.
pub type CpuAutodiff = burn::backend::Autodiff<Cpu>;

/// The CUDA backend (kernels compiled at run time by NVRTC).
#[cfg(feature = "cuda")]
pub type Cuda = burn::backend::Cuda;
#[cfg(feature = "cuda")]
pub type CudaAutodiff = burn::backend::Autodiff<Cuda>;

/// The wgpu backend (Vulkan, Metal, DX12; lavapipe without a GPU): `--device wgpu` in a build
/// with `--features wgpu`, and the generic-path tests.
#[cfg(feature = "wgpu")]
pub type Wgpu = burn::backend::Wgpu;

/// A device named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
    /// burn's wgpu backend on the default adapter (Vulkan, Metal, DX12; lavapipe on a machine
    /// without a GPU): the generic code path without CUDA.
    Wgpu,
}

impl DeviceSpec {
    /// Parses `cpu`, `cuda` or `cuda:N` and checks that this build has the backend.
    pub fn parse(s: &str) -> Result<Self> {
        let spec = Self::parse_name(s)?;
        if matches!(spec, DeviceSpec::Cuda(_)) && !cfg!(feature = "cuda") {
            return Err(Error::InvalidArgument(format!(
                "device {s:?} needs a CUDA build; rebuild with `cargo build --release --features cuda`"
            )));
        }
        if spec == DeviceSpec::Wgpu && !cfg!(feature = "wgpu") {
            return Err(Error::InvalidArgument(
                "device \"wgpu\" needs a wgpu build; rebuild with `cargo build --release --features wgpu`".into(),
            ));
        }
        Ok(spec)
    }

    /// Parses a device name whether or not this build can run on it (`--dry-run` plans for
    /// GPUs from any build).
    pub fn parse_name(s: &str) -> Result<Self> {
        let spec = match s {
            "cpu" => DeviceSpec::Cpu,
            "cuda" | "gpu" => DeviceSpec::Cuda(0),
            "wgpu" => DeviceSpec::Wgpu,
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(i)) => DeviceSpec::Cuda(i),
                _ => {
                    return Err(Error::InvalidArgument(format!("unknown device {s:?}; use cpu, cuda, cuda:N or wgpu")));
                }
            },
        };
        Ok(spec)
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Cuda(i) => write!(f, "cuda:{i}"),
            DeviceSpec::Wgpu => write!(f, "wgpu"),
        }
    }
}

/// The device of a backend that a [`DeviceSpec`] names (all policies of a run share a backend;
/// each may have its own device of it).
pub trait DeviceOf: burn::tensor::backend::Backend {
    fn device_of(spec: DeviceSpec) -> Self::Device;
}

impl DeviceOf for Cpu {
    fn device_of(_: DeviceSpec) -> Self::Device {
        Default::default()
    }
}

#[cfg(feature = "cuda")]
impl DeviceOf for Cuda {
    fn device_of(spec: DeviceSpec) -> Self::Device {
        match spec {
            DeviceSpec::Cuda(i) => burn::backend::cuda::CudaDevice::new(i),
            _ => burn::backend::cuda::CudaDevice::new(0),
        }
    }
}

#[cfg(feature = "wgpu")]
impl DeviceOf for Wgpu {
    fn device_of(_: DeviceSpec) -> Self::Device {
        burn::backend::wgpu::WgpuDevice::default()
    }
}

/// Runs a generic body with the backend and device that a [`DeviceSpec`] names:
/// `with_backend!(spec, |B, device| run::<B>(&device))`. On a GPU it first starts the device
/// ([`device_check::start`]: the kernel cache, then one kernel; `?` on a malformed cubecl
/// configuration or a device that cannot run it).
#[macro_export]
macro_rules! with_backend {
    ($spec:expr, |$b:ident, $dev:ident| $body:expr) => {{
        match $spec {
            $crate::backend::DeviceSpec::Cpu => {
                type $b = $crate::backend::Cpu;
                let $dev: <$b as burn::tensor::backend::BackendTypes>::Device = Default::default();
                $body
            }
            #[cfg(feature = "cuda")]
            $crate::backend::DeviceSpec::Cuda(i) => {
                type $b = $crate::backend::Cuda;
                let $dev = burn::backend::cuda::CudaDevice::new(i);
                $crate::backend::device_check::start::<$b>($crate::backend::DeviceSpec::Cuda(i), &$dev)?;
                $body
            }
            #[cfg(not(feature = "cuda"))]
            $crate::backend::DeviceSpec::Cuda(_) => unreachable!("DeviceSpec::parse rejects cuda without the feature"),
            #[cfg(feature = "wgpu")]
            $crate::backend::DeviceSpec::Wgpu => {
                type $b = $crate::backend::Wgpu;
                let $dev = burn::backend::wgpu::WgpuDevice::default();
                $crate::backend::device_check::start::<$b>($crate::backend::DeviceSpec::Wgpu, &$dev)?;
                $body
            }
            #[cfg(not(feature = "wgpu"))]
            $crate::backend::DeviceSpec::Wgpu => unreachable!("DeviceSpec::parse rejects wgpu without the feature"),
        }
    }};
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    use super::*;

    #[test]
    fn training_passes_run_in_their_own_pool_one_at_a_time() {
        // With one worker the passes could not overlap anyway, and the test would show nothing.
        assert!(rayon::current_num_threads() >= 2, "needs 2+ rayon threads: 2+ cores, RAYON_NUM_THREADS unset or 2+");
        let (inside, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let pass = || {
            // A worker of the training pool: no other work is queued where it waits.
            let name = std::thread::current().name().map(str::to_string);
            assert!(name.is_some_and(|n| n.starts_with(TRAINING_THREAD)), "a training pass runs in its pool");
            most.fetch_max(inside.fetch_add(1, SeqCst) + 1, SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(100));
            inside.fetch_sub(1, SeqCst);
        };
        std::thread::scope(|s| {
            let callers: Vec<_> = (0..3).map(|_| s.spawn(|| training_on_a_cpu_worker::<Cpu, _>(pass))).collect();
            callers.into_iter().for_each(|c| c.join().expect("a pass"));
        });
        assert_eq!(most.load(SeqCst), 1, "a second training pass ran beside the first");
        // With the fast paths off (a test's comparison), the caller runs the pass itself.
        let caller = std::thread::current().id();
        flex_fast::without_fast_paths(|| {
            training_on_a_cpu_worker::<Cpu, _>(|| assert_eq!(std::thread::current().id(), caller))
        });
    }
}
