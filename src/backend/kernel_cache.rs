//! Compiled GPU kernels kept between runs.
//!
//! burn's GPU backends compile each kernel the first time a process launches it (CUDA: NVRTC
//! to PTX, which the driver then translates for the GPU). A training run launches a few hundred
//! distinct kernels (289 in the embedded default's first step and held-out passes, counted on
//! lavapipe); on an H200 that first step's update took 12.5 s and the next one 1.4 s. cubecl can
//! keep what it compiled on disk, keyed by the kernel's id (`[compilation] cache`), but leaves
//! that off by default: hacpo turns it on under `$HACPO_CACHE/kernels/<key>/`, where the key
//! names what the code was compiled for (backend, GPU architecture, driver, the pinned burn), so
//! that a cache in a home directory shared by machines with different GPUs never hands one GPU
//! another's code. The driver keeps its own translations (`~/.nv/ComputeCache`).
//!
//! A `cubecl.toml` (or a `burn.toml` with a `[cubecl]` table) in the working directory or above
//! is the user's own configuration: hacpo leaves everything to it, after checking that it parses
//! (cubecl would panic on a malformed one). `HACPO_KERNEL_CACHE=off` turns hacpo's cache off.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::DeviceSpec;
use crate::error::{Error, Result};

/// The burn release hacpo pins (`Cargo.toml`): its kernels' code is part of the cache key.
pub const BURN_VERSION: &str = "0.21.0";

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
/// device of `spec` is created; once per process, later calls return the first call's outcome.
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
                "compiled GPU kernels are kept in {} (HACPO_KERNEL_CACHE=off turns that off)",
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

/// Creates `dir` and writes a file in it.
fn writable(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    tempfile::NamedTempFile::new_in(dir).map(drop)
}

/// What compiled code depends on besides the kernel: the backend, and for CUDA the GPUs'
/// architecture and driver (`nvidia-smi`); every GPU of the machine must agree, since which of
/// them a process sees depends on `CUDA_VISIBLE_DEVICES`, which `nvidia-smi` ignores.
fn device_key(spec: DeviceSpec) -> std::result::Result<String, String> {
    match spec {
        DeviceSpec::Cpu => Err("the CPU compiles no kernels at run time".into()),
        DeviceSpec::Wgpu => Ok(format!("wgpu-burn{BURN_VERSION}")),
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
/// output: `cuda-sm90-driver580.159.04-burn0.21.0`.
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
        keys.push(format!("cuda-sm{major}{minor}-driver{driver}-burn{BURN_VERSION}"));
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
        let b = BURN_VERSION;
        assert_eq!(
            cuda_key("9.0, 580.159.04\n9.0, 580.159.04\n").unwrap(),
            format!("cuda-sm90-driver580.159.04-burn{b}")
        );
        assert_eq!(cuda_key("12.0, 590.1\n").unwrap(), format!("cuda-sm120-driver590.1-burn{b}"));
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
        assert!(kernels.join("cuda-sm90-driver580.1-burn0.21.0").is_dir());
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

    /// The pinned burn of the cache key is Cargo.toml's.
    #[test]
    fn the_keys_burn_version_is_the_pinned_one() {
        let manifest = include_str!("../../Cargo.toml");
        assert!(manifest.contains(&format!("burn = {{ version = \"={BURN_VERSION}\"")), "update BURN_VERSION");
    }
}
