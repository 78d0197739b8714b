//! Where the python tool runs a model's program: a bubblewrap sandbox with its own user, PID,
//! network, IPC, UTS and cgroup namespaces, a read-only system (`/usr` and the interpreter's
//! own prefix, nothing else of the host's files), size-limited in-memory `/work` (the program's
//! directory), `/tmp` and `/dev/shm`, an empty environment, no capabilities, and every process
//! it starts in one cgroup whose memory and process count are bounded; all of it is killed when
//! the call ends (the PID namespace dies with its first process, the cgroup is emptied).
//!
//! An RL run executes whatever a policy writes, thousands of times: what one program may do
//! to the machine (read a hub token from the trainer's environment, delete another run's
//! checkpoints, fork without bound, leave processes behind) is bounded here. When the sandbox
//! cannot be made (no bubblewrap, user namespaces disabled, no way to bound the process tree)
//! the tool refuses with the reason; `sandbox = "none"` runs programs unconfined, for machines
//! that are themselves throw-away containers.

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How the python tool confines a program (`workload.turns.python.sandbox`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// bubblewrap namespaces and a cgroup (refused where they cannot be made).
    #[default]
    Bubblewrap,
    /// Unconfined but for rlimits, in the user's own account: only for a machine that is
    /// itself disposable. Said on stderr once per run.
    None,
}

/// The python tool's interpreter and the limits of one program run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PythonLimits {
    /// The interpreter, a name looked up on PATH or a path.
    pub python: String,
    /// Wall-clock seconds before everything the program started is killed.
    pub timeout_s: f64,
    /// Memory in MiB: the address-space limit of each process (allocating beyond it raises
    /// MemoryError) and, in the sandbox, the limit of all its processes together.
    pub memory_mib: u64,
    /// Bytes of standard output (and of standard error) kept; the rest is dropped.
    pub output_bytes: usize,
    /// How programs are confined: "bubblewrap" (default) or "none" (unsafe).
    pub sandbox: Isolation,
    /// MiB the program may write in its directory (an in-memory file system in the sandbox).
    pub disk_mib: u64,
    /// Processes (and threads) the program may run at once.
    pub processes: u64,
}

impl Default for PythonLimits {
    fn default() -> Self {
        PythonLimits {
            python: "python3".into(),
            timeout_s: 10.0,
            memory_mib: 512,
            output_bytes: 64 * 1024,
            sandbox: Isolation::Bubblewrap,
            disk_mib: 64,
            processes: 32,
        }
    }
}

/// MiB of the sandbox's `/tmp` and `/dev/shm` (charged to its memory like `/work`).
const TMP_MIB: u64 = 16;
const SHM_MIB: u64 = 1;

/// The interpreter as the program sees it: its executable and the prefixes it reads its
/// standard library from (bound read-only into the sandbox when they are not under /usr).
#[derive(Clone, Debug)]
pub struct Interpreter {
    pub executable: PathBuf,
    prefixes: Vec<PathBuf>,
}

/// The interpreter (`sys.executable`, `sys.prefix`, `sys.base_prefix`), asked once with the
/// parent's environment: launchers such as pyenv's shims need variables the program must not see.
pub fn interpreter(python: &str) -> Result<Interpreter> {
    static RESOLVED: Mutex<Vec<(String, Interpreter)>> = Mutex::new(Vec::new());
    let mut resolved = RESOLVED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, found)) = resolved.iter().find(|(name, _)| name == python) {
        return Ok(found.clone());
    }
    let missing = |why: String| {
        Error::InvalidArgument(format!(
            "cannot run {python} for the python tool: {why}. Install Python 3 (Debian: apt-get install -y python3), set the tool's `python` to an interpreter, or use the simulate tool"
        ))
    };
    let out = Command::new(python)
        .args(["-I", "-c", "import sys; print(sys.executable); print(sys.prefix); print(sys.base_prefix)"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| missing(e.to_string()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<PathBuf> = text.lines().map(|l| PathBuf::from(l.trim())).collect();
    if !out.status.success() || lines.len() != 3 || !lines.iter().all(|p| p.is_absolute()) {
        return Err(missing(format!(
            "it did not name its executable ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let executable = lines[0].clone();
    let mut prefixes: Vec<PathBuf> = lines[1..].to_vec();
    if let Some(dir) = executable.parent() {
        prefixes.push(dir.to_path_buf());
    }
    prefixes.retain(|p| !p.starts_with("/usr"));
    prefixes.sort();
    prefixes.dedup();
    // A prefix inside another needs no bind of its own.
    let outer = prefixes.clone();
    prefixes.retain(|p| !outer.iter().any(|o| o != p && p.starts_with(o)));
    let found = Interpreter { executable, prefixes };
    resolved.push((python.to_string(), found.clone()));
    Ok(found)
}

/// How the whole process tree of a program is bounded.
#[derive(Clone, Debug, PartialEq)]
enum TreeLimit {
    /// A child cgroup per run under this cgroup v2 directory (memory.max, pids.max).
    CgroupV2(PathBuf),
    /// Child cgroups per run under these cgroup v1 directories.
    CgroupV1 { memory: PathBuf, pids: PathBuf },
    /// RLIMIT_NPROC set inside the user namespace (an unprivileged trainer only: the kernel
    /// exempts root). Memory: each process's address-space limit.
    Nproc,
}

/// What the host offers, found once.
#[derive(Clone, Debug)]
struct Host {
    bwrap: PathBuf,
    tree: TreeLimit,
}

/// The host's sandbox, found and tried once per process (a probe program must run in it).
fn host(limits: &PythonLimits) -> Result<Host> {
    static FOUND: Mutex<Option<std::result::Result<Host, String>>> = Mutex::new(None);
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    if found.is_none() {
        *found = Some(find_host().and_then(|h| probe(&h, limits).map(|()| h)));
    }
    found.clone().expect("set above").map_err(|why| {
        Error::InvalidArgument(format!(
            "the python tool cannot sandbox programs here: {why}. A policy's programs run only in a sandbox; \
             set workload.turns.python.sandbox = \"none\" to run them unconfined (unsafe: only on a disposable \
             machine), or use the simulate tool"
        ))
    })
}

fn find_host() -> std::result::Result<Host, String> {
    let bwrap = which("bwrap").ok_or("bubblewrap is not installed (Debian: apt-get install -y bubblewrap)")?;
    let tree = cgroup_v2()
        .map(TreeLimit::CgroupV2)
        .or_else(|| cgroup_v1().map(|(memory, pids)| TreeLimit::CgroupV1 { memory, pids }))
        .or_else(|| (unsafe { libc::geteuid() } != 0 && Path::new(PRLIMIT).is_file()).then_some(TreeLimit::Nproc))
        .ok_or(
            "there is no writable cgroup with the memory and pids controllers to bound a program's processes, and \
             hacpo runs as root, whom the kernel's process-count limit does not bind (run hacpo as an unprivileged \
             user, or give it a cgroup it may create children in)",
        )?;
    Ok(Host { bwrap, tree })
}

const PRLIMIT: &str = "/usr/bin/prlimit";

/// A program found on PATH.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// A program that must run in the sandbox before any of the policy's do: a sandbox that
/// cannot start (user namespaces disabled, an old bubblewrap) says why here, once.
fn probe(host: &Host, limits: &PythonLimits) -> std::result::Result<(), String> {
    let run = run_confined(host, "print(6 * 7)\n", limits).map_err(|e| e.to_string())?;
    if run.end == super::tool::RunEnd::Exited(0) && run.stdout.trim() == "42" {
        return Ok(());
    }
    let said = run.stderr.lines().find(|l| l.starts_with("bwrap:")).unwrap_or(run.stderr.trim());
    Err(format!("a test program did not run in bubblewrap ({:?}: {said})", run.end))
}

/// The cgroup v2 directory this process is in, when memory and pids can be limited below it.
fn cgroup_v2() -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let mount = cgroup_mount("cgroup2", None)?;
    let dir = mount.join(path.trim_start_matches('/'));
    let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control")).ok()?;
    if !(enabled.split_whitespace().any(|c| c == "memory") && enabled.split_whitespace().any(|c| c == "pids")) {
        // Enabling them fails where this cgroup holds processes (v2's no-internal-process
        // rule); a delegated subtree usually has them on already.
        std::fs::write(dir.join("cgroup.subtree_control"), "+memory +pids").ok()?;
    }
    try_child(std::slice::from_ref(&dir), &[("memory.max", "67108864"), ("pids.max", "8")]).then_some(dir)
}

/// The cgroup v1 memory and pids directories this process is in, when children can be made.
fn cgroup_v1() -> Option<(PathBuf, PathBuf)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let dir_of = |controller: &str| -> Option<PathBuf> {
        let path = own.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers.split(',').any(|c| c == controller).then_some(path)
        })?;
        Some(cgroup_mount("cgroup", Some(controller))?.join(path.trim_start_matches('/')))
    };
    let (memory, pids) = (dir_of("memory")?, dir_of("pids")?);
    let ok = try_child(std::slice::from_ref(&memory), &[("memory.limit_in_bytes", "67108864")])
        && try_child(std::slice::from_ref(&pids), &[("pids.max", "8")]);
    ok.then_some((memory, pids))
}

/// Where a cgroup file system (of `controller`, for v1) is mounted, from /proc/self/mountinfo
/// (only mounts of the hierarchy's root: a bind of a sub-cgroup would need path arithmetic).
fn cgroup_mount(fstype: &str, controller: Option<&str>) -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fields: Vec<&str> = left.split(' ').collect();
        let theirs: Vec<&str> = right.split(' ').collect();
        let (root, point) = (*fields.get(3)?, *fields.get(4)?);
        if theirs.first() != Some(&fstype) || root != "/" {
            return None;
        }
        let options = theirs.get(2).copied().unwrap_or_default();
        controller.is_none_or(|c| options.split(',').any(|o| o == c)).then(|| PathBuf::from(point))
    })
}

/// Whether a child cgroup can be made under each of `parents` with these settings (then
/// removed again).
fn try_child(parents: &[PathBuf], settings: &[(&str, &str)]) -> bool {
    let name = format!("hacpo-probe-{}", std::process::id());
    let children: Vec<PathBuf> = parents.iter().map(|p| p.join(&name)).collect();
    let ok = children.iter().all(|c| std::fs::create_dir(c).is_ok() || c.is_dir())
        && settings.iter().all(|(file, value)| children.iter().any(|c| std::fs::write(c.join(file), value).is_ok()));
    for c in &children {
        let _ = std::fs::remove_dir(c);
    }
    ok
}

/// One run's cgroup(s): made before the program starts, emptied and removed when it ends.
struct RunCgroup {
    dirs: Vec<PathBuf>,
    /// `cgroup.procs` of each, open for writing: the spawned process joins by writing "0".
    procs: Vec<std::fs::File>,
}

impl RunCgroup {
    fn create(tree: &TreeLimit, limits: &PythonLimits) -> Result<Option<Self>> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = format!("hacpo-py-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        // The in-memory file systems are charged to the cgroup's memory too.
        let memory = (limits.memory_mib + limits.disk_mib + TMP_MIB + SHM_MIB).saturating_mul(1 << 20).to_string();
        let pids = limits.processes.to_string();
        let (dirs, settings): (Vec<PathBuf>, Vec<(usize, &str, String)>) = match tree {
            TreeLimit::Nproc => return Ok(None),
            TreeLimit::CgroupV2(parent) => (
                vec![parent.join(&name)],
                vec![(0, "memory.max", memory.clone()), (0, "memory.swap.max", "0".into()), (0, "pids.max", pids)],
            ),
            TreeLimit::CgroupV1 { memory: m, pids: p } => (
                vec![m.join(&name), p.join(&name)],
                vec![
                    (0, "memory.limit_in_bytes", memory.clone()),
                    (0, "memory.memsw.limit_in_bytes", memory),
                    (1, "pids.max", pids),
                ],
            ),
        };
        let failed = |path: &Path, e: std::io::Error| {
            Error::Internal(format!("cannot set up the python tool's cgroup {}: {e}", path.display()))
        };
        let mut made = RunCgroup { dirs: Vec::new(), procs: Vec::new() };
        for d in &dirs {
            std::fs::create_dir(d).map_err(|e| failed(d, e))?;
            made.dirs.push(d.clone());
        }
        for (i, file, value) in settings {
            let path = dirs[i].join(file);
            // Swap limits exist only where swap accounting is on.
            if let Err(e) = std::fs::write(&path, &value)
                && !(file.contains("swap") || file.contains("memsw"))
            {
                return Err(failed(&path, e));
            }
        }
        for d in &dirs {
            let path = d.join("cgroup.procs");
            made.procs.push(std::fs::OpenOptions::new().write(true).open(&path).map_err(|e| failed(&path, e))?);
        }
        Ok(Some(made))
    }

    /// Kills every process left in the cgroup and removes it.
    fn finish(self) {
        let RunCgroup { dirs, procs } = self;
        drop(procs);
        for d in &dirs {
            if d.join("cgroup.kill").exists() {
                let _ = std::fs::write(d.join("cgroup.kill"), "1");
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        for d in &dirs {
            loop {
                let pids = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                for pid in pids.lines().filter_map(|l| l.trim().parse::<libc::pid_t>().ok()) {
                    // SAFETY: kill(2) of a process in this run's own cgroup.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                // A cgroup is removable a moment after its last process is reaped.
                if std::fs::remove_dir(d).is_ok() || !d.exists() || Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

/// The bubblewrap arguments that confine `python -I main.py` (the script bound read-only).
fn bwrap_args(host: &Host, python: &Interpreter, script: &Path, limits: &PythonLimits) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |items: &[&str]| a.extend(items.iter().map(OsString::from));
    push(&["--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]);
    push(&["--unshare-cgroup-try", "--uid", "65534", "--gid", "65534", "--disable-userns"]);
    push(&["--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL", "--hostname", "sandbox"]);
    push(&["--ro-bind", "/usr", "/usr"]);
    // The top-level directories that hold programs and libraries: symlinks into /usr on a
    // merged-/usr system, directories of their own on older ones.
    for top in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
        let path = Path::new(top);
        match std::fs::read_link(path) {
            Ok(target) => {
                a.extend(["--symlink".into(), target.into_os_string(), top.into()]);
            }
            Err(_) if path.is_dir() => a.extend(["--ro-bind".into(), top.into(), top.into()]),
            Err(_) => {}
        }
    }
    for p in &python.prefixes {
        a.extend(["--ro-bind".into(), p.clone().into_os_string(), p.clone().into_os_string()]);
    }
    let size = |mib: u64| mib.saturating_mul(1 << 20).to_string();
    let mut push = |items: &[&str]| a.extend(items.iter().map(OsString::from));
    push(&["--proc", "/proc", "--dev", "/dev"]);
    push(&["--size", &size(TMP_MIB), "--tmpfs", "/tmp", "--size", &size(SHM_MIB), "--tmpfs", "/dev/shm"]);
    push(&["--size", &size(limits.disk_mib), "--tmpfs", "/work"]);
    a.extend(["--ro-bind".into(), script.as_os_str().to_owned(), "/work/main.py".into()]);
    let mut push = |items: &[&str]| a.extend(items.iter().map(OsString::from));
    push(&["--chdir", "/work", "--remount-ro", "/", "--remount-ro", "/dev", "--"]);
    if host.tree == TreeLimit::Nproc {
        a.extend([PRLIMIT.into(), format!("--nproc={}", limits.processes).into(), "--".into()]);
    }
    a.extend([python.executable.clone().into_os_string(), "-I".into(), "main.py".into()]);
    a
}

/// A program's command and what to clean up after it.
pub struct Confined {
    pub command: Command,
    cgroup: Option<RunCgroup>,
    /// bubblewrap reports a program killed by signal N as exit code 128 + N.
    pub sandboxed: bool,
}

impl Confined {
    /// Kills whatever the program left running and removes its cgroup.
    pub fn finish(self) {
        if let Some(c) = self.cgroup {
            c.finish();
        }
    }
}

/// The command that runs `script` (`main.py` in its directory) under `limits`: in the sandbox,
/// or unconfined with `sandbox = "none"`.
pub fn confine(script: &Path, limits: &PythonLimits) -> Result<Confined> {
    let python = interpreter(&limits.python)?;
    match limits.sandbox {
        Isolation::None => {
            warn_unconfined();
            let dir = script.parent().unwrap_or(Path::new("."));
            let mut command = Command::new(&python.executable);
            command.arg("-I").arg("main.py").current_dir(dir);
            with_limits(&mut command, limits, &[]);
            Ok(Confined { command, cgroup: None, sandboxed: false })
        }
        Isolation::Bubblewrap => confine_in(&host(limits)?, &python, script, limits),
    }
}

fn confine_in(host: &Host, python: &Interpreter, script: &Path, limits: &PythonLimits) -> Result<Confined> {
    let cgroup = RunCgroup::create(&host.tree, limits)?;
    let mut command = Command::new(&host.bwrap);
    command.args(bwrap_args(host, python, script, limits)).current_dir("/");
    let join: Vec<i32> = cgroup.iter().flat_map(|c| c.procs.iter().map(|f| f.as_raw_fd())).collect();
    with_limits(&mut command, limits, &join);
    Ok(Confined { command, cgroup, sandboxed: true })
}

/// Runs a short program in the sandbox of `host` (the probe).
fn run_confined(host: &Host, code: &str, limits: &PythonLimits) -> Result<super::tool::ProgramRun> {
    let python = interpreter(&limits.python)?;
    let dir = tempfile::tempdir().map_err(|e| Error::io("create a directory for", Path::new("python tool"), e))?;
    let script = dir.path().join("main.py");
    std::fs::write(&script, code).map_err(|e| Error::io("write", &script, e))?;
    let confined = confine_in(host, &python, &script, limits)?;
    super::tool::run_command(confined, limits)
}

static WARNED: std::sync::Once = std::sync::Once::new();

fn warn_unconfined() {
    WARNED.call_once(|| {
        eprintln!(
            "warning: workload.turns.python.sandbox = \"none\": the policy's programs run unconfined, as you, with \
             your files, network and environment"
        );
    });
}

/// An empty environment, no input, its own process group, joined to the run's cgroups (the
/// open `cgroup.procs` files in `join`), under address-space, CPU-time, file-size and core
/// limits (inherited by everything the program starts).
#[cfg(unix)]
fn with_limits(cmd: &mut Command, limits: &PythonLimits, join: &[i32]) {
    use std::os::unix::process::CommandExt;
    let memory = limits.memory_mib.saturating_mul(1 << 20);
    // CPU seconds: the wall-clock limit rounded up, plus one, as a backstop to the kill.
    let cpu = limits.timeout_s.max(0.0).ceil() as u64 + 1;
    let join = join.to_vec();
    cmd.env_clear().stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.process_group(0);
    // SAFETY: between fork and exec only async-signal-safe calls (write, getrlimit, setrlimit)
    // are made, on values computed before the fork.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &join {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // Never above the inherited hard limit (raising it would fail with EPERM).
            let set = |resource, value: u64| {
                let mut current = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                if libc::getrlimit(resource, &mut current) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let value = (value as libc::rlim_t).min(current.rlim_max);
                let lim = libc::rlimit { rlim_cur: value, rlim_max: value };
                if libc::setrlimit(resource, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            };
            set(libc::RLIMIT_AS, memory)?;
            set(libc::RLIMIT_CPU, cpu)?;
            set(libc::RLIMIT_FSIZE, 16 << 20)?;
            set(libc::RLIMIT_CORE, 0)?;
            Ok(())
        });
    }
}

#[cfg(not(unix))]
fn with_limits(cmd: &mut Command, _limits: &PythonLimits, _join: &[i32]) {
    cmd.env_clear().stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
}

/// Whether the python tool can sandbox programs here (the reason and the way out if not).
pub fn check(limits: &PythonLimits) -> Result<()> {
    interpreter(&limits.python)?;
    match limits.sandbox {
        Isolation::None => Ok(()),
        Isolation::Bubblewrap => host(limits).map(|_| ()),
    }
}

/// One test per way a program escaped the tool before the sandbox (each ran, and did harm,
/// unconfined): now each is blocked. They need bubblewrap (Debian: apt-get install -y
/// bubblewrap) and fail saying so where it is missing.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::tool::{ProgramRun, RunEnd, run_python};

    fn limits() -> PythonLimits {
        PythonLimits { timeout_s: 20.0, memory_mib: 512, output_bytes: 1 << 16, ..PythonLimits::default() }
    }

    fn run(code: &str) -> ProgramRun {
        run_python(code, &limits()).unwrap()
    }

    #[test]
    fn the_host_sandbox_is_available() {
        // The tests below would say the same, less directly.
        check(&limits()).unwrap();
    }

    #[test]
    fn files_outside_its_directory_cannot_be_read() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, "s3cret-file").unwrap();
        let code = format!(
            "import os\nfor p in [{:?}, '/etc/passwd', '/etc/hostname', {:?}]:\n    try:\n        print(p, open(p).read()[:40])\n    except OSError as e:\n        print(p, 'blocked', type(e).__name__)\nprint(sorted(os.listdir('/')))\n",
            secret.display().to_string(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
        );
        let r = run(&code);
        assert!(r.ok(), "{r:?}");
        assert!(
            !r.stdout.contains("s3cret-file") && !r.stdout.contains("root:") && !r.stdout.contains("[package]"),
            "{}",
            r.stdout
        );
        assert_eq!(r.stdout.matches("blocked").count(), 4, "{}", r.stdout);
    }

    #[test]
    fn the_trainers_environment_cannot_be_read_through_proc() {
        // SAFETY: no other test of this binary reads this variable.
        unsafe { std::env::set_var("HACPO_SANDBOX_TEST_TOKEN", "hf_s3cret_token") };
        let code = format!(
            "import os\nfound = []\nfor pid in os.listdir('/proc'):\n    try:\n        if b'hf_s3cret' in open(f'/proc/{{pid}}/environ', 'rb').read():\n            found.append(pid)\n    except OSError:\n        pass\ntry:\n    print('parent', open('/proc/{}/environ', 'rb').read()[:80])\nexcept OSError as e:\n    print('parent blocked', type(e).__name__)\nprint('found', found, 'pids', [p for p in os.listdir('/proc') if p.isdigit()])\n",
            std::process::id()
        );
        let r = run(&code);
        assert!(r.ok(), "{r:?}");
        assert!(r.stdout.contains("found []") && !r.stdout.contains("hf_s3cret"), "{}", r.stdout);
        // Only the sandbox's own processes exist in its PID namespace.
        let pids = r.stdout.split("pids").nth(1).unwrap_or_default().matches('\'').count() / 2;
        assert!(pids <= 3, "{}", r.stdout);
    }

    #[test]
    fn another_runs_files_cannot_be_deleted_or_truncated() {
        let run_dir = tempfile::tempdir().unwrap();
        let ckpt = run_dir.path().join("checkpoints/step-000010");
        std::fs::create_dir_all(&ckpt).unwrap();
        std::fs::write(ckpt.join("model.safetensors"), "weights").unwrap();
        let metrics = run_dir.path().join("metrics.jsonl");
        std::fs::write(&metrics, "{\"step\": 1}\n").unwrap();
        let code = format!(
            "import shutil\ntry:\n    shutil.rmtree({:?})\nexcept OSError as e:\n    print('rmtree blocked', type(e).__name__)\ntry:\n    open({:?}, 'w').close()\nexcept OSError as e:\n    print('truncate blocked', type(e).__name__)\nfor d in ['/usr/lib', '/', '/dev', '/tmp/../usr']:\n    try:\n        open(d + '/hacpo-escape-{}', 'w').close()\n        print('wrote', d)\n    except OSError as e:\n        print('write blocked', d)\n",
            ckpt.parent().unwrap().display().to_string(),
            metrics.display().to_string(),
            std::process::id()
        );
        let r = run(&code);
        assert!(r.ok(), "{r:?}");
        assert_eq!(std::fs::read_to_string(ckpt.join("model.safetensors")).unwrap(), "weights");
        assert_eq!(std::fs::read_to_string(&metrics).unwrap(), "{\"step\": 1}\n");
        let escaped = format!("/usr/lib/hacpo-escape-{}", std::process::id());
        assert!(!r.stdout.contains("wrote") && !Path::new(&escaped).exists(), "{}", r.stdout);
    }

    #[test]
    fn the_network_is_unreachable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let code = format!(
            "import socket\nfor addr in [('127.0.0.1', {port}), ('1.1.1.1', 53), ('8.8.8.8', 443)]:\n    s = socket.socket()\n    s.settimeout(2)\n    try:\n        s.connect(addr)\n        print('connected', addr)\n    except OSError as e:\n        print('blocked', addr, type(e).__name__)\nprint(sorted(n for _, n in socket.if_nameindex()))\n"
        );
        let r = run(&code);
        assert!(r.ok(), "{r:?}");
        assert!(!r.stdout.contains("connected"), "{}", r.stdout);
        assert!(r.stdout.contains("['lo']"), "only a private loopback: {}", r.stdout);
        assert!(listener.accept().is_err(), "the host's listener was reached");
    }

    #[test]
    fn the_trainer_and_other_processes_cannot_be_signalled() {
        let mut victim = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let code = format!(
            "import os, signal\nfor pid in [{}, {}]:\n    try:\n        os.kill(pid, signal.SIGKILL)\n        print('killed', pid)\n    except OSError as e:\n        print('blocked', pid, type(e).__name__)\n",
            std::process::id(),
            victim.id()
        );
        let r = run(&code);
        assert!(!r.stdout.contains("killed"), "{}", r.stdout);
        assert!(victim.try_wait().unwrap().is_none(), "the unrelated process was killed");
        victim.kill().unwrap();
        let _ = victim.wait();
    }

    #[test]
    fn no_process_outlives_the_call() {
        let marker = format!("{}.{}", 61 + std::process::id() % 1000, std::process::id());
        let code = format!(
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execv('/bin/sleep', ['sleep', '{marker}'])\n    os._exit(0)\ntime.sleep(0.5)\nprint('parent done')\n"
        );
        let started = Instant::now();
        let r = run(&code);
        assert!(r.stdout.contains("parent done"), "{r:?}");
        assert!(started.elapsed() < Duration::from_secs(15));
        std::thread::sleep(Duration::from_millis(200));
        let left: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains(&marker))
            .collect();
        assert!(left.is_empty(), "left running: {left:?}");
    }

    #[test]
    fn memory_is_bounded_across_the_whole_process_tree() {
        // Three children of 400 MB each under a 512 MiB limit: at most one holds its memory at
        // a time. Started one after another, each keeps its 400 MB until the parent opens a gate
        // at the end, so a slow machine cannot let one finish before the next starts. When a
        // child reports, the parent counts the earlier holders still alive half a second later
        // (the out-of-memory killer's victim has exited by then; a real holder waits forever).
        let code = r#"import os, select, time
report_r, report_w = os.pipe()
gate_r, gate_w = os.pipe()
holders, most = [], 0
def alive(pid):
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False
for i in range(3):
    pid = os.fork()
    if pid == 0:
        os.close(gate_w)
        try:
            b = bytearray(400 << 20)
            for j in range(0, len(b), 4096):
                b[j] = 1
            os.write(report_w, b'h')
            os.read(gate_r, 1)
        except MemoryError:
            pass
        os._exit(0)
    while alive(pid) and not select.select([report_r], [], [], 0.05)[0]:
        pass
    if select.select([report_r], [], [], 0)[0]:
        os.read(report_r, 1)
        time.sleep(0.5)
        holders = [h for h in holders if alive(h)]
        if alive(pid):
            holders.append(pid)
        most = max(most, len(holders))
os.close(gate_w)
for h in holders:
    alive(h) and os.waitpid(h, 0)
print('most holding at once', most)
"#;
        let r = run(code);
        let most: usize = r
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("most holding at once ")?.parse().ok())
            .unwrap_or_else(|| panic!("no count: {r:?}"));
        assert!(most <= 1, "{most} children held 400 MB at once: {r:?}");
    }

    #[test]
    fn the_number_of_processes_is_bounded() {
        let code = "import os, time\nn = 0\ntry:\n    for _ in range(500):\n        pid = os.fork()\n        if pid == 0:\n            time.sleep(3)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('stopped', type(e).__name__)\nprint('forked', n, flush=True)\nos._exit(0)\n";
        let r = run(code);
        let n: u64 =
            r.stdout.split("forked ").nth(1).and_then(|s| s.trim().parse().ok()).unwrap_or_else(|| panic!("{r:?}"));
        assert!(n < limits().processes, "forked {n}: {r:?}");
    }

    #[test]
    fn disk_writes_are_bounded_and_leave_nothing_on_the_host() {
        let code = "import os\ntotal = 0\nfor d in ['.', '/tmp', '/dev/shm']:\n    for i in range(100):\n        try:\n            with open(f'{d}/f{i}', 'wb') as f:\n                f.write(b'x' * (16 << 20))\n            total += 16\n        except OSError:\n            break\nprint('wrote MiB', total)\n";
        let before = free_disk();
        let r = run(code);
        let total: u64 =
            r.stdout.split("wrote MiB ").nth(1).and_then(|s| s.trim().parse().ok()).unwrap_or_else(|| panic!("{r:?}"));
        assert!(total <= limits().disk_mib + TMP_MIB + SHM_MIB, "wrote {total} MiB: {r:?}");
        assert!(free_disk() + (256 << 20) >= before, "the host disk filled");
    }

    fn free_disk() -> u64 {
        let path = std::ffi::CString::new(std::env::temp_dir().to_string_lossy().as_bytes()).unwrap();
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: statvfs into a zeroed struct of the right type.
        assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut s) }, 0);
        s.f_bavail as u64 * s.f_frsize as u64
    }

    #[test]
    fn a_killed_program_is_reported_as_a_signal() {
        let r = run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n");
        assert_eq!(r.end, RunEnd::Signalled(9), "{r:?}");
    }
}
