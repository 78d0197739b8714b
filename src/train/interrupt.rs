//! Ctrl-C (SIGINT) and SIGTERM during training. The first asks the trainer to stop after the
//! step in progress, with a checkpoint, so the run resumes where it stopped; a second stops at
//! once (the last checkpoint is kept; the step in progress is repeated on resume).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);
static INSTALLED: OnceLock<()> = OnceLock::new();

/// Installs the handler (once per process; later calls do nothing).
pub fn install() {
    INSTALLED.get_or_init(|| {
        let installed = ctrlc::set_handler(|| {
            if REQUESTED.swap(true, Ordering::SeqCst) {
                eprintln!("\nstopping now; the last checkpoint is kept");
                std::process::exit(crate::error::INTERRUPTED_EXIT_CODE);
            }
            eprintln!("\ninterrupted: finishing this step and saving a checkpoint (interrupt again to stop at once)");
        });
        if let Err(e) = installed {
            tracing::warn!("cannot handle Ctrl-C ({e}); an interrupt ends training without a final checkpoint");
        }
    });
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
