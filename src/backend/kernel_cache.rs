//! Compiled GPU kernels kept between runs.
//!
//! burn's GPU backends compile each kernel the first time a process launches it (CUDA: NVRTC
//! to PTX, which the driver then translates for the GPU). A training run launches a few hundred
//! distinct kernels (289 in the embedded default's first step and held-out passes, counted on
//! lavapipe); on an H200 that first step's update took 12.5 s and the next one 1.4 s (how much of
//! that is compiling is for a GPU run to measure). cubecl can keep what it compiled on disk (CUDA's
//! PTX, Vulkan's SPIR-V; WGSL is compiled by the driver every time), keyed by the kernel's id
//! (`[compilation] cache`), but leaves that off by default: hacpo turns it on under
//! `$HACPO_CACHE/kernels/<key>/`. A kernel's id does not cover its code or the GPU it was compiled
//! for, so the key does: the backend, for CUDA the GPUs' architecture and driver, and the
//! versions of the crates that write kernels (burn's, cubecl's, cubek's, from `Cargo.lock`).
//! A cache in a home directory shared by machines with different GPUs never hands one GPU
//! another's code, and an upgrade starts a new directory (old ones can be deleted). The driver
//! keeps its own translations of PTX (`~/.nv/ComputeCache`).
//!
//! A `cubecl.toml` (or a `burn.toml` with a `[cubecl]` table) in the working directory or above
//! is the user's own configuration: hacpo leaves everything to it, after checking that it parses
//! (cubecl would panic on a malformed one). `HACPO_KERNEL_CACHE=off` turns hacpo's cache off.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::DeviceSpec;
use crate::error::{Error, Result};

/// The burn release hacpo pins (`Cargo.toml`), named in the cache key.
pub const BURN_VERSION: &str = "0.21.0";

/// The cubecl release hacpo pins (`Cargo.toml`): cubecl's caches live under `<name>/<version>/`.
const CUBECL_VERSION: &str = "0.10.0";

/// The files cubecl keeps compiled kernels in, under the cache directory (cubecl-common's
/// `CompilationCache`): the directory must hold them, or cubecl panics opening them.
const CHUNKS: [&str; 2] = ["cuda/{v}/ptx/chunk0.cbor", "vulkan/{v}/spirv/chunk0.cbor"];

/// The files cubecl reads its configuration from, nearest first in each directory: a file of
/// its own, or a section of burn's.
const CONFIG_FILES: [&str; 2] = ["cubecl.toml", "CubeCL.toml"];
const SECTION_FILES: [&str; 2] = ["burn.toml", "Burn.toml"];

/// What a process does about compiled kernels, decided once, before its first GPU device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelCache {
    /// hacpo's cache, in this directory.
    Dir(PathBuf),
    /// The user's cubecl configuration, which cubecl reads itself.
    UserConfig(PathBuf),
    /// No cache, and why.
    Off(String),
}

/// Turns the kernel cache on (or leaves it to the user's cubecl configuration) before the first
/// device of `spec` starts (from [`super::device_check::start`]); once per process, later calls return the first call's outcome.
/// Errs on a malformed cubecl configuration file.
pub fn prepare(spec: DeviceSpec) -> Result<()> {
    static DECISION: OnceLock<std::result::Result<KernelCache, (String, String)>> = OnceLock::new();
    let decision = DECISION.get_or_init(|| {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let decided = decide(
            std::env::var("HACPO_KERNEL_CACHE").ok().as_deref(),
            &cwd,
            &crate::cache::root().join("kernels"),
            || device_key(spec),
        )?;
        let decided = apply(decided);
        match &decided {
            KernelCache::Dir(dir) => tracing::info!(
                "GPU kernel cache: {} (CUDA's and Vulkan's compiled kernels; HACPO_KERNEL_CACHE=off turns it off)",
                dir.display()
            ),
            KernelCache::UserConfig(file) => {
                tracing::info!("GPU kernels: cubecl's configuration is {}", file.display())
            }
            KernelCache::Off(why) => tracing::info!("GPU kernels are compiled anew: {why}"),
        }
        Ok(decided)
    });
    match decision {
        Ok(_) => Ok(()),
        Err((file, message)) => Err(Error::InvalidConfig { file: file.clone(), message: message.clone() }),
    }
}

/// The decision, from `HACPO_KERNEL_CACHE`'s value, the working directory (where cubecl looks
/// for its configuration), the directory hacpo's caches go under, and the device's key (`None`:
/// not known, so no cache). Errs with (file, message) on a malformed cubecl configuration.
pub fn decide(
    switch: Option<&str>,
    cwd: &Path,
    kernels_root: &Path,
    key: impl FnOnce() -> std::result::Result<String, String>,
) -> std::result::Result<KernelCache, (String, String)> {
    if let Some(file) = user_config(cwd)? {
        return Ok(KernelCache::UserConfig(file));
    }
    if matches!(switch.map(str::trim), Some("off" | "0" | "false" | "no")) {
        return Ok(KernelCache::Off("HACPO_KERNEL_CACHE is off".into()));
    }
    let key = match key() {
        Ok(key) => key,
        Err(why) => return Ok(KernelCache::Off(why)),
    };
    let dir = kernels_root.join(key);
    match writable(&dir) {
        Ok(()) => Ok(KernelCache::Dir(dir)),
        Err(e) => {
            tracing::warn!("compiled GPU kernels cannot be kept in {}: {e}; they are compiled anew", dir.display());
            Ok(KernelCache::Off(format!("cannot write to {}: {e}", dir.display())))
        }
    }
}

/// cubecl's configuration file as cubecl finds it (the working directory, then each parent: its
/// own file, else a `[cubecl]` table in burn's), checked to parse.
fn user_config(cwd: &Path) -> std::result::Result<Option<PathBuf>, (String, String)> {
    let malformed = |file: &Path, e: &dyn std::fmt::Display| {
        (file.display().to_string(), format!("{e}\ncubecl reads this file for its settings; fix or remove it"))
    };
    for dir in cwd.ancestors() {
        for name in CONFIG_FILES {
            let file = dir.join(name);
            if let Ok(text) = std::fs::read_to_string(&file) {
                check_config(toml::Value::Table(toml::from_str(&text).map_err(|e| malformed(&file, &e))?))
                    .map_err(|e| malformed(&file, &e))?;
                return Ok(Some(file));
            }
        }
        for name in SECTION_FILES {
            let file = dir.join(name);
            if let Ok(text) = std::fs::read_to_string(&file) {
                let mut table: toml::Table = toml::from_str(&text).map_err(|e| malformed(&file, &e))?;
                if let Some(section) = table.remove("cubecl") {
                    check_config(section).map_err(|e| malformed(&file, &e))?;
                    return Ok(Some(file));
                }
            }
        }
    }
    Ok(None)
}

/// Whether `value` is a configuration cubecl accepts (in a build with a GPU backend; without
/// one, cubecl reads nothing).
fn check_config(value: toml::Value) -> std::result::Result<(), String> {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        use serde::Deserialize;
        cubecl_runtime::config::CubeClRuntimeConfig::deserialize(value).map(|_| ()).map_err(|e| e.to_string())
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = value;
        Ok(())
    }
}

/// Opens what cubecl will open in `dir` as cubecl does (creating what is missing), and reads the
/// chunks already there: cubecl `expect`s all of that to work. (A disk that fills up during a run
/// still stops cubecl when it writes a new kernel.)
fn writable(dir: &Path) -> std::io::Result<()> {
    for chunk in CHUNKS.map(|c| dir.join(c.replace("{v}", CUBECL_VERSION))) {
        std::fs::create_dir_all(chunk.parent().expect("a chunk is in a directory"))?;
        std::fs::File::options().append(true).create(true).open(&chunk)?;
        std::fs::read(&chunk)?;
    }
    tempfile::NamedTempFile::new_in(dir).map(drop)
}

/// A hash of the versions of the crates whose code becomes kernels (`Cargo.lock`'s burn, cubecl
/// and cubek packages): any change to them starts a new cache directory.
pub fn kernel_crates_hash() -> u64 {
    let mut named: Vec<&str> = Vec::new();
    for package in include_str!("../../Cargo.lock").split("[[package]]") {
        let field = |key: &str| package.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim_matches('"'));
        if let (Some(name), Some(version)) = (field("name = "), field("version = "))
            && ["burn", "cubecl", "cubek"].iter().any(|p| name.starts_with(p))
        {
            named.extend([name, version]);
        }
    }
    crate::stable_hash::hash_bytes(named.join(" ").as_bytes())
}

/// What ends every key: the pinned burn and the kernel crates' hash.
fn crates_suffix() -> String {
    format!("burn{BURN_VERSION}-{:08x}", kernel_crates_hash() as u32)
}

/// What compiled code depends on besides the kernel: the backend, and for CUDA the GPUs'
/// architecture and driver (`nvidia-smi`); every GPU of the machine must agree, since which of
/// them a process sees depends on `CUDA_VISIBLE_DEVICES`, which `nvidia-smi` ignores.
fn device_key(spec: DeviceSpec) -> std::result::Result<String, String> {
    match spec {
        DeviceSpec::Cpu => Err("the CPU compiles no kernels at run time".into()),
        DeviceSpec::Wgpu => Ok(format!("wgpu-{}", crates_suffix())),
        DeviceSpec::Cuda(_) => {
            let out = std::process::Command::new("nvidia-smi")
                .args(["--query-gpu=compute_cap,driver_version", "--format=csv,noheader"])
                .output()
                .map_err(|e| format!("nvidia-smi did not run ({e}), so the GPU's architecture is not known"))?;
            if !out.status.success() {
                return Err("nvidia-smi failed, so the GPU's architecture is not known".into());
            }
            cuda_key(&String::from_utf8_lossy(&out.stdout))
        }
    }
}

/// The key of `nvidia-smi --query-gpu=compute_cap,driver_version --format=csv,noheader`'s
/// output: `cuda-sm90-driver580.159.04-burn0.21.0-<the kernel crates' hash>`.
pub fn cuda_key(smi: &str) -> std::result::Result<String, String> {
    let mut keys: Vec<String> = Vec::new();
    for line in smi.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (cap, driver) = line.split_once(',').ok_or_else(|| format!("unexpected nvidia-smi line {line:?}"))?;
        let (major, minor) =
            cap.trim().split_once('.').ok_or_else(|| format!("unexpected compute capability {cap:?}"))?;
        let driver = driver.trim();
        let plain = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '.');
        if !(plain(major) && plain(minor) && plain(driver)) {
            return Err(format!("unexpected nvidia-smi line {line:?}"));
        }
        keys.push(format!("cuda-sm{major}{minor}-driver{driver}-{}", crates_suffix()));
    }
    keys.sort_unstable();
    keys.dedup();
    match keys.as_slice() {
        [key] => Ok(key.clone()),
        [] => Err("nvidia-smi listed no GPU".into()),
        _ => Err(format!(
            "this machine's GPUs differ ({}): kernels compiled for one could reach another",
            keys.join(", ")
        )),
    }
}

/// Hands the decision to cubecl: hacpo's cache directory for compiled kernels and autotune
/// results, the `CUBECL_*` environment variables as cubecl reads them. Too late when something
/// read cubecl's configuration already (it is set once per process).
#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn apply(decided: KernelCache) -> KernelCache {
    use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig, cache::CacheConfig};
    let KernelCache::Dir(dir) = &decided else { return decided };
    let mut config = CubeClRuntimeConfig::default().override_from_env();
    config.compilation.cache = Some(CacheConfig::File(dir.clone()));
    config.autotune.cache = CacheConfig::File(dir.clone());
    // `RuntimeConfig::set` panics when the configuration is set already; this does not.
    let mut state = CubeClRuntimeConfig::storage().lock();
    if state.is_some() {
        return KernelCache::Off("cubecl's configuration was read before hacpo could set it".into());
    }
    *state = Some(std::sync::Arc::new(config));
    decided
}

#[cfg(not(any(feature = "cuda", feature = "wgpu")))]
fn apply(decided: KernelCache) -> KernelCache {
    decided
}

/// The configuration cubecl runs with in this process (reading it fixes it).
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub fn cubecl_cache_dirs() -> (Option<PathBuf>, PathBuf) {
    use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig};
    let config = CubeClRuntimeConfig::get();
    (config.compilation.cache.as_ref().map(|c| c.root()), config.autotune.cache.root())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> std::result::Result<String, String> {
        Ok("cuda-sm90-driver580.1-burn0.21.0".into())
    }

    /// The key names the architecture and driver, once for GPUs that agree; GPUs that differ,
    /// none, or output hacpo does not understand give no key (and no cache), never a panic.
    #[test]
    fn the_cuda_key_names_what_the_kernels_were_compiled_for() {
        let b = crates_suffix();
        assert_eq!(cuda_key("9.0, 580.159.04\n9.0, 580.159.04\n").unwrap(), format!("cuda-sm90-driver580.159.04-{b}"));
        assert_eq!(cuda_key("12.0, 590.1\n").unwrap(), format!("cuda-sm120-driver590.1-{b}"));
        assert!(cuda_key("9.0, 580.1\n8.0, 580.1\n").unwrap_err().contains("GPUs differ"));
        assert!(cuda_key("").unwrap_err().contains("no GPU"));
        for odd in ["[N/A], 580.1", "9.0", "9.0, ../../x", "90, 580.1"] {
            assert!(cuda_key(odd).is_err(), "{odd}");
        }
    }

    /// Without a cubecl configuration the cache goes under the key in a directory hacpo made;
    /// `HACPO_KERNEL_CACHE=off`, an unknown key or a directory that cannot be written turn it
    /// off with the reason.
    #[test]
    fn the_cache_goes_under_the_key_unless_turned_off_or_unwritable() {
        let cwd = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let kernels = root.path().join("kernels");
        let on = decide(None, cwd.path(), &kernels, key).unwrap();
        assert_eq!(on, KernelCache::Dir(kernels.join("cuda-sm90-driver580.1-burn0.21.0")));
        assert!(kernels.join("cuda-sm90-driver580.1-burn0.21.0/cuda").is_dir());
        assert_eq!(decide(Some("on"), cwd.path(), &kernels, key).unwrap(), on);
        for off in ["off", "0", "false", " no "] {
            assert_eq!(
                decide(Some(off), cwd.path(), &kernels, key).unwrap(),
                KernelCache::Off("HACPO_KERNEL_CACHE is off".into())
            );
        }
        let unknown = decide(None, cwd.path(), &kernels, || Err("nvidia-smi did not run".into())).unwrap();
        assert_eq!(unknown, KernelCache::Off("nvidia-smi did not run".into()));
        let file = root.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let KernelCache::Off(why) = decide(None, cwd.path(), &file.join("kernels"), key).unwrap() else {
            panic!("a path under a file cannot hold a cache");
        };
        assert!(why.starts_with("cannot write to"), "{why}");
    }

    /// A cubecl configuration in the working directory or above (its own file, or a `[cubecl]`
    /// table of burn's) is left to cubecl, even with the switch off; a burn.toml without that
    /// table is not one.
    #[test]
    fn a_cubecl_configuration_above_the_working_directory_is_the_users() {
        let top = tempfile::tempdir().unwrap();
        let cwd = top.path().join("a/b");
        std::fs::create_dir_all(&cwd).unwrap();
        let kernels = top.path().join("kernels");
        std::fs::write(top.path().join("a/burn.toml"), "[other]\nx = 1\n").unwrap();
        assert!(matches!(decide(None, &cwd, &kernels, key).unwrap(), KernelCache::Dir(_)));
        std::fs::write(top.path().join("burn.toml"), "[cubecl.compilation]\ncheck_mode = \"enforce\"\n").unwrap();
        assert_eq!(decide(None, &cwd, &kernels, key).unwrap(), KernelCache::UserConfig(top.path().join("burn.toml")));
        std::fs::write(top.path().join("a/cubecl.toml"), "[autotune]\nlevel = \"minimal\"\n").unwrap();
        assert_eq!(
            decide(Some("off"), &cwd, &kernels, key).unwrap(),
            KernelCache::UserConfig(top.path().join("a/cubecl.toml"))
        );
    }

    /// A cubecl.toml that is not TOML is an error that names the file (cubecl would panic on
    /// it); with a GPU backend built in, so is one that cubecl's settings reject.
    #[test]
    fn a_malformed_cubecl_configuration_is_an_error_naming_the_file() {
        let cwd = tempfile::tempdir().unwrap();
        let file = cwd.path().join("cubecl.toml");
        std::fs::write(&file, "[autotune\n").unwrap();
        let (named, message) = decide(None, cwd.path(), cwd.path(), key).unwrap_err();
        assert_eq!(named, file.display().to_string());
        assert!(message.contains("fix or remove it"), "{message}");
        if cfg!(any(feature = "cuda", feature = "wgpu")) {
            std::fs::write(&file, "[autotune]\nlevel = \"loud\"\n").unwrap();
            let (_, message) = decide(None, cwd.path(), cwd.path(), key).unwrap_err();
            assert!(message.contains("loud"), "{message}");
        }
    }

    /// The pinned burn and cubecl are Cargo.toml's; the kernel crates' hash covers the lock's
    /// burn, cubecl and cubek packages (this build has dozens) and nothing else.
    #[test]
    fn the_key_follows_the_pinned_and_locked_kernel_crates() {
        let manifest = include_str!("../../Cargo.toml");
        assert!(manifest.contains(&format!("burn = {{ version = \"={BURN_VERSION}\"")), "update BURN_VERSION");
        assert!(
            manifest.contains(&format!("cubecl-runtime = {{ version = \"={CUBECL_VERSION}\"")),
            "update CUBECL_VERSION"
        );
        let lock = include_str!("../../Cargo.lock");
        assert!(lock.matches("name = \"cubecl-").count() >= 5 && lock.matches("name = \"burn-").count() >= 5);
        assert_eq!(kernel_crates_hash(), kernel_crates_hash());
        assert_ne!(kernel_crates_hash(), crate::stable_hash::hash_bytes(b""));
    }

    /// The cache directory holds the chunk files cubecl opens; a chunk that cannot be opened
    /// (here a directory in its place) turns the cache off instead of letting cubecl panic.
    #[test]
    fn the_probe_opens_the_files_cubecl_will() {
        let cwd = tempfile::tempdir().unwrap();
        let kernels = tempfile::tempdir().unwrap();
        let KernelCache::Dir(dir) = decide(None, cwd.path(), kernels.path(), key).unwrap() else { panic!("on") };
        for chunk in CHUNKS {
            assert!(dir.join(chunk.replace("{v}", CUBECL_VERSION)).is_file(), "{chunk}");
        }
        let other = kernels.path().join("other");
        std::fs::create_dir_all(other.join("other/cuda/0.10.0/ptx/chunk0.cbor")).unwrap();
        let found = decide(None, cwd.path(), &other, || Ok("other".into())).unwrap();
        assert!(matches!(found, KernelCache::Off(ref why) if why.starts_with("cannot write to")), "{found:?}");
    }
}
