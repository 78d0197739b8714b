//! hacpo's own cache directory: pre-trained tiny agents (`tiny/`), compiled GPU kernels
//! (`kernels/`). Models and datasets from the hub stay in the hub's cache.

use std::path::PathBuf;

/// `$HACPO_CACHE`, else `~/.cache/hacpo`.
pub fn root() -> PathBuf {
    if let Some(d) = std::env::var_os("HACPO_CACHE") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache/hacpo")
}
