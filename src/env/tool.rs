//! The tool role's tools (PettingLLMs' two-role planning setting): `simulate` applies the tool
//! role's action list to a copy of the state and reports the outcome; `python` runs the tool
//! role's program and reads the action list it prints.
//!
//! The python tool runs untrusted model output: in the sandbox of [`super::sandbox`] (its own
//! namespaces, a read-only system, bounded memory, processes, disk and time, an empty
//! environment, everything killed at the end), its output read up to a cap.

use std::io::Read;
use std::path::Path;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{Instance, Outcome};
use crate::error::{Error, Result};

pub use super::sandbox::{Isolation, PythonLimits};

/// How a program run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunEnd {
    /// Exited with this code (0: success).
    Exited(i32),
    /// Killed at the wall-clock limit.
    TimedOut,
    /// Ended by a signal (the CPU limit's SIGXCPU, or SIGKILL/SIGSEGV at the memory limit).
    Signalled(i32),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProgramRun {
    pub end: RunEnd,
    pub stdout: String,
    pub stderr: String,
}

impl ProgramRun {
    pub fn ok(&self) -> bool {
        self.end == RunEnd::Exited(0)
    }

    /// What the plan role is shown: the output, or why there is none.
    pub fn report(&self) -> String {
        match &self.end {
            RunEnd::Exited(0) => self.stdout.clone(),
            RunEnd::Exited(code) => format!("error (exit code {code}): {}", last_lines(&self.stderr, 5)),
            RunEnd::TimedOut => "error: the program ran past its time limit and was stopped".into(),
            RunEnd::Signalled(sig) => format!("error: the program was killed by signal {sig} (a resource limit)"),
        }
    }
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The code of a model's answer: the last fenced block marked python, else the last fenced
/// block, else the text after an unclosed fence, else the whole text (PettingLLMs' order).
pub fn extract_code(text: &str) -> &str {
    let fences: Vec<usize> = text.match_indices("```").map(|(i, _)| i).collect();
    let blocks: Vec<(&str, &str)> = fences
        .chunks(2)
        .map(|pair| {
            let inner = &text[pair[0] + 3..pair.get(1).copied().unwrap_or(text.len())];
            match inner.split_once('\n') {
                Some((lang, body)) if lang.trim().chars().all(|c| c.is_ascii_alphanumeric()) => (lang.trim(), body),
                _ => ("", inner),
            }
        })
        .collect();
    let python = blocks.iter().rev().find(|(lang, _)| matches!(*lang, "python" | "py" | "python3"));
    python.or(blocks.last()).map_or(text, |(_, body)| body.trim_matches('\n'))
}

/// Whether the python tool can run programs here: its interpreter runs and the sandbox can be
/// made (a clear error naming what to install or set if not).
pub fn check_python(limits: &PythonLimits) -> Result<()> {
    super::sandbox::check(limits)
}

/// Runs `code` under `limits` in a fresh directory holding only it (`main.py`).
pub fn run_python(code: &str, limits: &PythonLimits) -> Result<ProgramRun> {
    let dir = tempfile::tempdir().map_err(|e| Error::io("create a directory for", Path::new("python tool"), e))?;
    let script = dir.path().join("main.py");
    std::fs::write(&script, code).map_err(|e| Error::io("write", &script, e))?;
    run_command(super::sandbox::confine(&script, limits)?, limits)
}

/// Runs a confined program to its end or its time limit, reading its output up to the cap,
/// and kills whatever it left behind.
pub(super) fn run_command(mut confined: super::sandbox::Confined, limits: &PythonLimits) -> Result<ProgramRun> {
    let spawned = confined.command.spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            confined.finish();
            return Err(Error::Internal(format!("cannot start the python tool: {e}")));
        }
    };
    let cap = limits.output_bytes;
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    // Each stream is read to its end by a thread (so the program never blocks on a full pipe)
    // into a shared buffer, kept up to the cap; `done` says when a stream has closed.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let read = |mut r: Box<dyn Read + Send>| {
        let kept = Arc::new(Mutex::new(Vec::new()));
        let (sink, done) = (kept.clone(), done_tx.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut kept = sink.lock().unwrap_or_else(|e| e.into_inner());
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
            let _ = done.send(());
        });
        kept
    };
    let (out, err) = (read(Box::new(out)), read(Box::new(err)));
    let deadline = Instant::now() + Duration::from_secs_f64(limits.timeout_s.max(0.0));
    let end = loop {
        match child.try_wait() {
            Ok(Some(status)) => break exit_of(status, confined.sandboxed),
            Ok(None) if Instant::now() >= deadline => {
                kill_group(&mut child);
                let _ = child.wait();
                break RunEnd::TimedOut;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                kill_group(&mut child);
                confined.finish();
                return Err(Error::Internal(format!("waiting for the python tool: {e}")));
            }
        }
    };
    // Everything is killed either way: a process the program left running must not outlive it.
    kill_group(&mut child);
    confined.finish();
    // Unconfined, a grandchild that left the group (setsid) may hold the pipes open: wait a
    // moment for the streams to close, then take what was read and leave the readers behind.
    let grace = Instant::now() + Duration::from_secs(1);
    for _ in 0..2 {
        if done_rx.recv_timeout(grace.saturating_duration_since(Instant::now())).is_err() {
            break;
        }
    }
    let text = |kept: &Arc<Mutex<Vec<u8>>>| {
        String::from_utf8_lossy(&kept.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    };
    let (stdout, stderr) = (text(&out), text(&err));
    Ok(ProgramRun { end, stdout, stderr })
}

/// How the program ended; in the sandbox, bubblewrap's exit code 128 + N is signal N.
#[cfg(unix)]
fn exit_of(status: std::process::ExitStatus, sandboxed: bool) -> RunEnd {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) if sandboxed && code > 128 && code < 128 + 65 => RunEnd::Signalled(code - 128),
        (Some(code), _) => RunEnd::Exited(code),
        (None, Some(sig)) => RunEnd::Signalled(sig),
        (None, None) => RunEnd::Exited(-1),
    }
}

#[cfg(not(unix))]
fn exit_of(status: std::process::ExitStatus, _sandboxed: bool) -> RunEnd {
    RunEnd::Exited(status.code().unwrap_or(-1))
}

#[cfg(unix)]
fn kill_group(child: &mut std::process::Child) {
    // SAFETY: kill(2) on the process group the child leads (process_group(0) made it one).
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
    }
}

#[cfg(not(unix))]
fn kill_group(child: &mut std::process::Child) {
    let _ = child.kill();
}

/// What a tool returned to the plan role.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolResult {
    /// The text shown to the plan role.
    pub report: String,
    /// The outcome of the tool's action on a copy of the state (`None`: no action to apply).
    pub outcome: Option<Outcome>,
    /// The python program failed (error exit, timeout, limit): the tool error rate's numerator.
    pub tool_error: bool,
}

/// The `simulate` tool: the tool role's answer is an action list, applied to a copy of `state`.
pub fn simulate(state: &Instance, answer: &str) -> ToolResult {
    let mut copy = state.clone();
    let outcome = copy.apply(answer);
    let report = format!("Simulated: {}\n{}", copy.describe(&outcome), copy.render());
    ToolResult { report, outcome: Some(outcome), tool_error: false }
}

/// The `python` tool: the tool role's answer holds a program; it runs, and the action list it
/// prints is applied to a copy of `state`.
pub fn python(state: &Instance, answer: &str, limits: &PythonLimits) -> Result<ToolResult> {
    let run = run_python(extract_code(answer), limits)?;
    if !run.ok() {
        return Ok(ToolResult { report: run.report(), outcome: None, tool_error: true });
    }
    let mut copy = state.clone();
    let outcome = copy.apply(&run.stdout);
    let report = format!(
        "The program printed:\n{}\nIts actions: {}\n{}",
        run.stdout.trim_end(),
        copy.describe(&outcome),
        copy.render()
    );
    Ok(ToolResult { report, outcome: Some(outcome), tool_error: false })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{EnvKind, Split};

    fn quick() -> PythonLimits {
        PythonLimits { timeout_s: 3.0, memory_mib: 256, output_bytes: 4096, ..PythonLimits::default() }
    }

    #[test]
    fn code_is_taken_from_the_last_fenced_block() {
        assert_eq!(extract_code("x\n```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```\n"), "print(2)");
        assert_eq!(extract_code("```\nprint(3)\n```"), "print(3)");
        assert_eq!(extract_code("plan:\n```python\nprint(4)\n"), "print(4)");
        assert_eq!(extract_code("print(5)"), "print(5)");
    }

    #[test]
    fn a_program_prints_its_actions_and_they_are_simulated() {
        let state = Instance::generate(EnvKind::PlanPath, Split::Train, 0);
        let program = format!("```python\nprint('**Actions List**:', {:?})\n```", state.solution().unwrap());
        let result = python(&state, &program, &quick()).unwrap();
        assert!(!result.tool_error, "{}", result.report);
        assert!(result.outcome.unwrap().solved, "{}", result.report);
    }

    #[test]
    fn a_program_that_loops_forever_is_killed_at_the_time_limit() {
        let started = Instant::now();
        let run = run_python("while True:\n    pass\n", &PythonLimits { timeout_s: 1.0, ..quick() }).unwrap();
        // Killed by the wall clock (SIGKILL) or, on a busy machine, the CPU limit (SIGXCPU).
        assert!(matches!(run.end, RunEnd::TimedOut | RunEnd::Signalled(_)), "{run:?}");
        assert!(started.elapsed() < Duration::from_secs(30));
        assert!(run.report().starts_with("error"));
    }

    #[test]
    fn a_program_that_allocates_without_bound_is_stopped_by_the_memory_limit() {
        let run = run_python("x = []\nwhile True:\n    x.append(bytearray(1 << 24))\n", &quick()).unwrap();
        assert!(!run.ok(), "{run:?}");
        assert!(matches!(run.end, RunEnd::Exited(_) | RunEnd::Signalled(_)), "{run:?}");
        assert!(run.stderr.contains("MemoryError") || matches!(run.end, RunEnd::Signalled(_)), "{run:?}");
    }

    #[test]
    fn a_program_sees_no_environment_variable_of_the_parent_and_an_empty_directory() {
        // SAFETY: tests in this binary do not read this variable concurrently.
        unsafe { std::env::set_var("HACPO_TOOL_SECRET", "s3cret") };
        let code = "import os\nprint(sorted(os.environ.keys()))\nprint(os.listdir('.'))\nprint(os.environ.get('HACPO_TOOL_SECRET'))\n";
        let run = run_python(code, &quick()).unwrap();
        assert!(run.ok(), "{run:?}");
        assert!(!run.stdout.contains("s3cret") && !run.stdout.contains("HACPO_TOOL_SECRET"), "{}", run.stdout);
        assert!(!run.stdout.contains("PATH'") && !run.stdout.contains("HOME"), "{}", run.stdout);
        assert!(run.stdout.contains("['main.py']"), "{}", run.stdout);
    }

    #[test]
    fn output_beyond_the_cap_is_dropped_without_blocking_the_program() {
        let run = run_python("import sys\nsys.stdout.write('a' * 10_000_000)\n", &quick()).unwrap();
        assert!(run.ok(), "{:?}", run.end);
        assert_eq!(run.stdout.len(), quick().output_bytes);
    }

    #[test]
    fn a_grandchild_that_leaves_the_group_and_keeps_the_pipes_does_not_hang_the_tool() {
        let code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nprint('parent done')\n";
        let started = Instant::now();
        let run = run_python(code, &quick()).unwrap();
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
        assert!(run.stdout.contains("parent done"), "{run:?}");
    }

    #[test]
    fn a_missing_interpreter_is_a_clear_error() {
        let limits = PythonLimits { python: "/nonexistent/python9".into(), ..quick() };
        let err = run_python("print(1)", &limits).unwrap_err().to_string();
        assert!(err.contains("apt-get install -y python3") && err.contains("simulate tool"), "{err}");
    }

    #[test]
    fn a_failing_program_is_a_tool_error_shown_to_the_plan_role() {
        let state = Instance::generate(EnvKind::Sokoban, Split::Train, 0);
        let result = python(&state, "```python\nraise ValueError('no plan')\n```", &quick()).unwrap();
        assert!(result.tool_error && result.outcome.is_none());
        assert!(result.report.contains("ValueError: no plan"), "{}", result.report);
        // The simulate tool never errs: an unreadable answer is a format failure it reports.
        let sim = simulate(&state, "no list");
        assert!(!sim.tool_error && sim.outcome.unwrap().format_error.is_some());
    }
}
