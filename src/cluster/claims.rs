//! Who hosts what: the claim a process writes under `host.<name>` in the run's key-value
//! bucket, refreshed by its heartbeats, and the comparison of a joining process's config with
//! the run's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Seconds without a heartbeat after which a claim no longer holds its host (heartbeats come
/// every [`HEARTBEAT_S`]).
pub const STALE_AFTER_S: f64 = 15.0;
/// Seconds between heartbeats.
pub const HEARTBEAT_S: f64 = 2.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimState {
    Running,
    /// The process ended (finished, failed or interrupted) and let go of its host.
    Stopped,
}

/// A process's claim on a host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Claim {
    pub host: String,
    pub policies: Vec<String>,
    pub pid: u32,
    /// The machine's host name.
    pub machine: String,
    /// The step this process has reached.
    pub step: u64,
    pub state: ClaimState,
    /// Milliseconds since the epoch, by the writer's clock, of the last heartbeat.
    pub heartbeat_ms: u64,
}

impl Claim {
    /// Seconds since the last heartbeat, by this machine's clock.
    pub fn age_s(&self, now_ms: u64) -> f64 {
        now_ms.saturating_sub(self.heartbeat_ms) as f64 / 1000.0
    }

    /// Whether the claim still holds its host, when that can be told here: a stopped process
    /// does not; one on this machine does while it beats and its pid lives (a SIGKILLed
    /// process gives its host up at once). For a process on another machine, `None`: its
    /// clock may disagree with ours, so only watching its claim change tells (see
    /// `RunStore::alive`).
    pub fn holds_here(&self, now_ms: u64, this_machine: &str) -> Option<bool> {
        if self.state != ClaimState::Running {
            return Some(false);
        }
        (self.machine == this_machine).then(|| self.age_s(now_ms) <= STALE_AFTER_S && pid_alive(self.pid))
    }

    /// `pid@machine`.
    pub fn process(&self) -> String {
        format!("{}@{}", self.pid, self.machine)
    }
}

/// Whether a process with this pid runs on this machine.
fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // Signal 0 checks existence only; EPERM means it exists under another user.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// This machine's host name.
pub fn machine_name() -> String {
    let mut buf = [0u8; 256];
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if ok && end > 0 { String::from_utf8_lossy(&buf[..end]).into_owned() } else { "unknown".into() }
}

/// The keys whose values differ between two configs (TOML), as `key: the run has X, this
/// process Y` lines, sorted by key.
pub fn config_differences(run: &str, mine: &str) -> Vec<String> {
    let (run, mine) = (flatten(run), flatten(mine));
    let keys: std::collections::BTreeSet<&String> = run.keys().chain(mine.keys()).collect();
    keys.into_iter()
        .filter(|k| run.get(*k) != mine.get(*k))
        .map(|k| {
            let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "nothing".into());
            format!("{k}: the run has {}, this process {}", show(run.get(k)), show(mine.get(k)))
        })
        .collect()
}

/// Every leaf of a TOML document under its dotted path (arrays of tables indexed).
fn flatten(text: &str) -> BTreeMap<String, String> {
    fn walk(prefix: &str, v: &toml::Value, out: &mut BTreeMap<String, String>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    walk(&if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") }, v, out);
                }
            }
            toml::Value::Array(a) if a.iter().any(toml::Value::is_table) => {
                for (i, v) in a.iter().enumerate() {
                    walk(&format!("{prefix}[{i}]"), v, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    match toml::from_str::<toml::Value>(text) {
        Ok(v) => walk("", &v, &mut out),
        Err(_) => {
            out.insert("(the whole config)".into(), text.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(machine: &str, pid: u32, age_ms: u64, state: ClaimState) -> (Claim, u64) {
        let now = 1_000_000;
        let c = Claim {
            host: "a".into(),
            policies: vec!["p0".into()],
            pid,
            machine: machine.into(),
            step: 3,
            state,
            heartbeat_ms: now - age_ms,
        };
        (c, now)
    }

    #[test]
    fn a_claim_holds_while_its_process_runs_and_beats() {
        let me = std::process::id();
        let (c, now) = claim("here", me, 1000, ClaimState::Running);
        assert_eq!(c.holds_here(now, "here"), Some(true));
        let (c, now) = claim("here", me, 1000, ClaimState::Stopped);
        assert_eq!(c.holds_here(now, "here"), Some(false), "a stopped process lets go");
        let (c, now) = claim("here", me, (STALE_AFTER_S as u64 + 1) * 1000, ClaimState::Running);
        assert_eq!(c.holds_here(now, "here"), Some(false), "no heartbeat for longer than the limit");
        let (c, now) = claim("there", 1, (STALE_AFTER_S as u64 + 100) * 1000, ClaimState::Running);
        assert_eq!(c.holds_here(now, "here"), None, "another machine's clock is not trusted");
        // A pid that cannot exist on this machine: the process is gone, its claim with it.
        let (c, now) = claim("here", u32::MAX - 7, 1000, ClaimState::Running);
        assert_eq!(c.holds_here(now, "here"), Some(false));
    }

    #[test]
    fn config_differences_name_each_key_and_both_values() {
        let run = "[algo]\nlr = 1e-6\nname = \"hacpo\"\n[[policies]]\nmodel = \"a\"\n";
        let mine = "[algo]\nlr = 2e-6\nname = \"hacpo\"\n[[policies]]\nmodel = \"b\"\n[run]\nsteps = 3\n";
        let d = config_differences(run, mine);
        assert_eq!(
            d,
            vec![
                "algo.lr: the run has 0.000001, this process 0.000002".to_string(),
                "policies[0].model: the run has \"a\", this process \"b\"".to_string(),
                "run.steps: the run has nothing, this process 3".to_string(),
            ]
        );
        assert!(config_differences(run, run).is_empty());
    }
}
