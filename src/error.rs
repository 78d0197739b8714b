//! The library's error type.
//!
//! Every variant that a user can cause (a wrong path, a malformed file, an unknown model id, a
//! prompt that does not fit) carries enough context to say what is wrong *and* how to fix it,
//! because `main` prints these messages verbatim and exits with code 2. Internal failures
//! (bugs, I/O errors we did not anticipate) exit with code 1.

use std::path::{Path, PathBuf};

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory the user named (or that a model directory must contain) is missing.
    #[error("{what} not found: {path}\n{hint}")]
    NotFound { what: String, path: PathBuf, hint: String },

    /// Reading or writing a file failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A configuration file is malformed or a key holds an invalid value.
    #[error("invalid {file}: {message}")]
    InvalidConfig { file: String, message: String },

    /// The checkpoint is of a model architecture hacpo does not implement.
    #[error(
        "unsupported architecture {found:?} in {file}; hacpo implements {supported}.\n\
         Use a Llama-3.x, Qwen2/2.5 or Qwen3 checkpoint."
    )]
    UnsupportedArchitecture { found: String, file: String, supported: &'static str },

    /// A weight tensor is present but its shape disagrees with `config.json`.
    #[error(
        "weight {name} has shape {found:?} in {file}, but the model config implies {expected:?}.\n\
         The weights and config.json do not belong to the same model."
    )]
    WeightShape { name: String, file: String, expected: Vec<usize>, found: Vec<usize> },

    /// A weight the architecture needs is absent from the checkpoint.
    #[error(
        "weight {name} is missing from {file}.\n\
         The checkpoint is incomplete or belongs to a different architecture than config.json says."
    )]
    MissingWeight { name: String, file: String },

    /// A weight file could not be parsed (truncated download, wrong format, unknown dtype).
    #[error("cannot read weights from {path}: {message}")]
    WeightFile { path: PathBuf, message: String },

    /// A model id that is neither a path nor a zoo entry.
    #[error(
        "unknown model {id:?}: it is not a local path and not a zoo id.\nKnown zoo ids: {known}.\nRun `hacpo models` for the list, or pass a model directory or a .gguf file."
    )]
    UnknownModel { id: String, known: String },

    /// The model is not in the local hub cache and cannot be downloaded.
    #[error(
        "cannot get {repo} from the Hugging Face hub: {reason}\n\
         The files are not in the local cache ({cache}). Either connect to the network, \
         or download them elsewhere (`{download}`) and copy them into that cache, or {local}."
    )]
    Download { repo: String, reason: String, cache: PathBuf, download: String, local: String },

    /// Tokenizer loading, encoding or decoding failed.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),

    /// A chat template failed to render.
    #[error("chat template error: {0}")]
    ChatTemplate(String),

    /// The prompt (plus what must be generated) does not fit into the model's context.
    #[error(
        "the prompt has {prompt_tokens} tokens but the model's context is {context} tokens \
         (max_position_embeddings); shorten the prompt"
    )]
    PromptTooLong { prompt_tokens: usize, context: usize },

    /// A command-line value or request parameter is invalid.
    #[error("{0}")]
    InvalidArgument(String),

    /// A GGUF file could not be imported.
    #[error("cannot import GGUF {path}: {message}")]
    Gguf { path: PathBuf, message: String },

    /// Training diverged: a loss or gradient norm is NaN or infinite.
    #[error(
        "the {what} of agent {agent} is {value} at step {step}; training stopped without saving \
         this step, so the last checkpoint is the last good state. Lower algo.optimizer.lr or \
         algo.grad_clip, or check the data of this step."
    )]
    NonFinite { agent: String, step: u64, what: &'static str, value: f64 },

    /// Training stopped on Ctrl-C or SIGTERM after saving a checkpoint.
    #[error(
        "interrupted after step {step} of {total}; the run is saved: continue it with `hacpo train --resume {run_dir}`"
    )]
    Interrupted { step: u64, total: u64, run_dir: String },

    /// Another thread of the same phase failed; its own error is the one to report.
    #[error("{peer} failed: {message}")]
    PeerFailed { peer: String, message: String },

    /// Anything else: a bug or an unexpected condition.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The exit code of a run stopped by a signal (128 + SIGINT).
pub const INTERRUPTED_EXIT_CODE: i32 = 130;

impl Error {
    /// Exit code for the CLI: 2 for errors the user can fix, 1 for internal failures.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Interrupted { .. } => INTERRUPTED_EXIT_CODE,
            Error::Io { .. } | Error::Internal(_) | Error::NonFinite { .. } | Error::PeerFailed { .. } => 1,
            _ => 2,
        }
    }

    pub fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            return Error::NotFound { what: "file".into(), path: path.to_path_buf(), hint: "Check the path.".into() };
        }
        // A directory given where a file is expected is the user's to fix (exit 2).
        if matches!(action, "read" | "open") && path.is_dir() {
            return Error::InvalidArgument(format!("{} is a directory; give a file", path.display()));
        }
        // So are a file where a directory should be, permissions and a full disk: say which.
        let place = path.display();
        match source.kind() {
            std::io::ErrorKind::NotADirectory => Error::InvalidArgument(format!(
                "cannot {action} {place}: a part of this path is a file, not a directory; check the path"
            )),
            std::io::ErrorKind::InvalidData if action == "read" => {
                Error::InvalidArgument(format!("cannot read {place}: {source}; give a UTF-8 text file"))
            }
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => Error::InvalidArgument(
                format!("cannot {action} {place}: {source}; check the permissions, or choose another place"),
            ),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded | std::io::ErrorKind::FileTooLarge => {
                Error::InvalidArgument(format!(
                    "cannot {action} {place}: the disk is full ({source}); free some space (or choose another \
                     place) and run again: what was written before is intact"
                ))
            }
            _ => Error::Io { action, path: path.to_path_buf(), source },
        }
    }

    pub fn config(file: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidConfig { file: file.into(), message: message.into() }
    }
}

/// Of two errors from threads of one phase, the one to report: a thread's own error rather than
/// another's "a peer failed" echo of it, so a user error in any thread keeps its exit code 2.
pub fn root_cause(current: Option<Error>, next: Error) -> Error {
    match current {
        Some(e) if !matches!(e, Error::PeerFailed { .. }) => e,
        Some(e) if matches!(next, Error::PeerFailed { .. }) => e,
        _ => next,
    }
}

/// Checks, before long work starts, that a file can be written at `path` (its directory exists
/// and is writable, and `path` is not a directory).
pub fn check_writable(path: &Path) -> Result<()> {
    let bad = |why: String| Error::InvalidArgument(format!("cannot write {}: {why}", path.display()));
    if path.is_dir() {
        return Err(bad("it is a directory; give a file name".into()));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(bad(format!("the directory {} does not exist", parent.display())));
    }
    probe_beside(path).map(|_| ()).map_err(|e| bad(e.to_string()))
}

/// Creates (and removes) an empty file beside `path`, the way any file of ours is created:
/// whether files can be written there, and with which permissions.
pub(crate) fn probe_beside(path: &Path) -> std::io::Result<std::fs::Metadata> {
    let probe = temp_path_for(path);
    let made = std::fs::File::create(&probe).and_then(|f| f.metadata());
    let _ = std::fs::remove_file(&probe);
    made
}

/// Reads a whole file, mapping failures to [`Error`] with the path.
pub(crate) fn read_to_string(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| Error::io("read", path, e))?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1;
        Error::InvalidArgument(format!("{}: line {line} is not valid UTF-8; save the file as UTF-8", path.display()))
    })
}

/// Writes `bytes` to `path` atomically: a temporary file beside it, then a rename, so a crash
/// never leaves a half-written checkpoint under the final name.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path_for(path);
    if let Err(e) = std::fs::write(&tmp, bytes) {
        // A full disk leaves no half-written temporary behind.
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io("write", path, e));
    }
    std::fs::rename(&tmp, path).map_err(|e| Error::io("rename into place", path, e))
}

/// The temporary sibling used by [`write_atomic`].
pub(crate) fn temp_path_for(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".tmp{}", std::process::id()));
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_are_directories_or_not_utf8_are_user_errors_naming_the_place() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_to_string(dir.path()).unwrap_err();
        assert!(e.exit_code() == 2 && e.to_string().contains("is a directory"), "{e}");
        let path = dir.path().join("data.jsonl");
        std::fs::write(&path, b"{\"a\": 1}\n{\"a\": \"\xff\"}\n").unwrap();
        let e = read_to_string(&path).unwrap_err();
        assert!(e.exit_code() == 2 && e.to_string().contains("line 2 is not valid UTF-8"), "{e}");
    }

    /// Files the user names but cannot read or write are theirs to fix: exit code 2, saying why.
    #[test]
    fn permissions_full_disks_and_files_for_directories_are_user_errors() {
        use std::io::{Error as IoError, ErrorKind};
        let p = Path::new("/data/run/config.toml");
        for (kind, says) in [
            (ErrorKind::PermissionDenied, "check the permissions"),
            (ErrorKind::NotADirectory, "is a file, not a directory"),
            (ErrorKind::StorageFull, "the disk is full"),
            (ErrorKind::ReadOnlyFilesystem, "check the permissions"),
        ] {
            let e = Error::io("write", p, IoError::from(kind));
            assert!(e.exit_code() == 2 && e.to_string().contains(says) && e.to_string().contains("/data/run"), "{e}");
        }
        let e = Error::io("read", p, IoError::new(ErrorKind::InvalidData, "stream did not contain valid UTF-8"));
        assert!(e.exit_code() == 2 && e.to_string().contains("UTF-8"), "{e}");
        // What the user cannot fix stays an internal failure.
        assert_eq!(Error::io("write", p, IoError::from(ErrorKind::BrokenPipe)).exit_code(), 1);
    }

    #[test]
    fn a_threads_own_error_wins_over_the_echoes_of_it() {
        let echo = || Error::PeerFailed { peer: "tiny-llama".into(), message: "prompt too long".into() };
        let own = || Error::PromptTooLong { prompt_tokens: 9000, context: 4096 };
        // Agent 0 saw the echo first, agent 1's own error comes second: the own error is reported.
        let e = root_cause(Some(echo()), own());
        assert!(matches!(e, Error::PromptTooLong { .. }) && e.exit_code() == 2, "{e}");
        let e = root_cause(Some(own()), echo());
        assert!(matches!(e, Error::PromptTooLong { .. }));
        assert_eq!(root_cause(None, echo()).exit_code(), 1);
    }
}
