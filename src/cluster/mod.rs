//! A run's policies in several processes, on one machine or several (`[cluster]`).
//!
//! Every process of a run executes the same staged step for the policies it hosts; what must
//! cross between processes (a step's records, the statistics every policy needs from every
//! other) goes through a [`Bus`]: each host hands in its part of a phase and gets every host's
//! part back, in host order, once all have published. Two buses implement it: [`LocalBus`],
//! one process hosting every policy (the embedded default, nothing leaves the process), and
//! [`nats::NatsBus`], NATS JetStream (a durable stream per run for the records, a key-value
//! bucket for membership and heartbeats, an object store for records over the server's payload
//! limit and for weight snapshots). Workloads and algorithms never see which one runs.

mod claims;
mod membership;
pub mod nats;
mod snapshots;
pub mod store;

use serde::{Deserialize, Serialize};

use crate::error::Result;

pub use claims::{Claim, ClaimState, config_differences, machine_name};

/// `[cluster]`: the NATS server, the run's name on it, and which process hosts which policies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// The server, e.g. `nats://10.0.0.5:4222`, started with JetStream (`nats-server -js`).
    pub nats: String,
    /// The run's name on the server (letters, digits, `-`, `_`): its stream, key-value bucket
    /// and object store are named after it, so two runs on one server never meet.
    pub run: String,
    /// How long a process waits for another before it stops, naming the missing one.
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    /// Which policies each process hosts (`[[cluster.hosts]]`); every policy exactly once.
    pub hosts: Vec<HostConfig>,
}

/// One process of a run: its name (`hacpo train --host NAME`) and the policies it trains.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    pub name: String,
    pub policies: Vec<String>,
}

fn default_timeout_s() -> f64 {
    600.0
}

/// A name that goes into a subject, a stream or a bucket name unchanged.
fn is_token(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl ClusterConfig {
    /// Rejects a table that cannot describe a run of `policies` (their display names), naming
    /// the key and the fix.
    pub fn validate(&self, policies: &[String]) -> std::result::Result<(), String> {
        if !(self.nats.starts_with("nats://") || self.nats.starts_with("tls://")) {
            return Err(format!("cluster.nats: expected a URL like nats://127.0.0.1:4222, got {:?}", self.nats));
        }
        if !is_token(&self.run) {
            return Err(format!(
                "cluster.run: {:?} is not a run name: use 1 to 64 letters, digits, '-' or '_'",
                self.run
            ));
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) {
            return Err(format!("cluster.timeout_s: must be a finite number of seconds > 0, got {}", self.timeout_s));
        }
        if self.hosts.is_empty() {
            return Err("cluster.hosts: no hosts; add [[cluster.hosts]] tables with a name and policies".into());
        }
        let mut host_of: Vec<Option<&str>> = vec![None; policies.len()];
        for (i, h) in self.hosts.iter().enumerate() {
            if !is_token(&h.name) {
                return Err(format!(
                    "cluster.hosts[{i}].name: {:?} is not a host name: use 1 to 64 letters, digits, '-' or '_'",
                    h.name
                ));
            }
            if self.hosts[..i].iter().any(|o| o.name == h.name) {
                return Err(format!("cluster.hosts[{i}].name: {:?} names two hosts; give each its own name", h.name));
            }
            if h.policies.is_empty() {
                return Err(format!("cluster.hosts[{i}].policies: host {:?} hosts no policy", h.name));
            }
            for p in &h.policies {
                let Some(k) = policies.iter().position(|n| n == p) else {
                    return Err(format!(
                        "cluster.hosts[{i}].policies: no policy {p:?}; the policies are {}",
                        policies.join(", ")
                    ));
                };
                if let Some(other) = host_of[k].replace(&h.name) {
                    return Err(format!(
                        "cluster.hosts[{i}].policies: policy {p:?} is hosted by both {other:?} and {:?}; \
                         every policy is trained by exactly one process",
                        h.name
                    ));
                }
            }
        }
        if let Some(k) = host_of.iter().position(Option::is_none) {
            return Err(format!(
                "cluster.hosts: no host trains policy {:?}; add it to one host's policies",
                policies[k]
            ));
        }
        Ok(())
    }

    /// The host called `name`, or an error listing the hosts.
    pub fn host(&self, name: &str) -> std::result::Result<&HostConfig, String> {
        self.hosts.iter().find(|h| h.name == name).ok_or_else(|| {
            let names: Vec<&str> = self.hosts.iter().map(|h| h.name.as_str()).collect();
            format!("--host {name:?}: the run's hosts are {}", names.join(", "))
        })
    }
}

/// What crosses between the processes of a run.
pub trait Bus: Send + Sync {
    /// This process's host name.
    fn host(&self) -> &str;

    /// Every host of the run, in the order [`Bus::all_gather`] returns their parts.
    fn hosts(&self) -> &[String];

    /// Publishes `mine` as this host's part of `phase` in `step` and returns every host's part,
    /// in host order, once all have published: the barrier that ends a phase. A part published
    /// once stays readable, so a process that resumes from a checkpoint replays the steps it
    /// lost without anyone publishing again.
    fn all_gather(&self, step: u64, phase: &str, mine: Vec<u8>) -> Result<Vec<Vec<u8>>>;

    /// Records that this host has reached `step` (heartbeats and `hacpo cluster status`).
    fn reached(&self, step: u64);
}

/// One process hosts every policy: a phase's parts are this process's own.
pub struct LocalBus {
    hosts: Vec<String>,
}

impl LocalBus {
    pub fn new() -> Self {
        LocalBus { hosts: vec!["local".to_string()] }
    }
}

impl Default for LocalBus {
    fn default() -> Self {
        Self::new()
    }
}

impl Bus for LocalBus {
    fn host(&self) -> &str {
        &self.hosts[0]
    }

    fn hosts(&self) -> &[String] {
        &self.hosts
    }

    fn all_gather(&self, _step: u64, _phase: &str, mine: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine])
    }

    fn reached(&self, _step: u64) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(toml: &str) -> ClusterConfig {
        toml::from_str(toml).unwrap()
    }

    fn two_hosts() -> ClusterConfig {
        table(
            r#"nats = "nats://127.0.0.1:4222"
               run = "duo"
               [[hosts]]
               name = "a"
               policies = ["p0"]
               [[hosts]]
               name = "b"
               policies = ["p1"]"#,
        )
    }

    #[test]
    fn a_table_hosting_every_policy_once_is_accepted() {
        let c = two_hosts();
        assert_eq!(c.timeout_s, 600.0);
        c.validate(&["p0".into(), "p1".into()]).unwrap();
        assert_eq!(c.host("b").unwrap().policies, vec!["p1".to_string()]);
        assert!(c.host("c").unwrap_err().contains("a, b"));
    }

    #[test]
    fn every_mistake_names_its_key() {
        let names = ["p0".to_string(), "p1".to_string()];
        type Mistake = Box<dyn Fn(&mut ClusterConfig)>;
        let cases: Vec<(Mistake, &str)> = vec![
            (Box::new(|c| c.nats = "localhost:4222".into()), "cluster.nats"),
            (Box::new(|c| c.run = "a.b".into()), "cluster.run"),
            (Box::new(|c| c.timeout_s = f64::NAN), "cluster.timeout_s"),
            (Box::new(|c| c.hosts.clear()), "cluster.hosts: no hosts"),
            (Box::new(|c| c.hosts[1].name = "a".into()), "cluster.hosts[1].name"),
            (Box::new(|c| c.hosts[1].name = "b c".into()), "cluster.hosts[1].name"),
            (Box::new(|c| c.hosts[1].policies = vec!["p0".into()]), "hosted by both"),
            (Box::new(|c| c.hosts[1].policies = vec!["p9".into()]), "no policy \"p9\""),
            (Box::new(|c| c.hosts[1].policies.clear()), "hosts no policy"),
            (Box::new(|c| c.hosts.truncate(1)), "no host trains policy \"p1\""),
        ];
        for (break_it, expected) in cases {
            let mut c = two_hosts();
            break_it(&mut c);
            let err = c.validate(&names).unwrap_err();
            assert!(err.contains(expected), "{err} (expected {expected})");
        }
    }

    #[test]
    fn the_local_bus_returns_its_own_part() {
        let bus = LocalBus::new();
        assert_eq!(bus.all_gather(3, "rollout", vec![1, 2]).unwrap(), vec![vec![1, 2]]);
        assert_eq!(bus.hosts().len(), 1);
    }
}
