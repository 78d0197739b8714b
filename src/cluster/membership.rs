//! A process's membership of a run: the config check, the claim on its host, and the
//! heartbeats that keep the claim. Every write of the claim names the revision it replaces,
//! so a process that was paused past its host's takeover cannot overwrite the new owner's
//! claim: it finds out, and stops.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv;

use super::claims::{Claim, ClaimState, now_ms};
use super::config_differences;
use super::store::RunStore;
use crate::error::{Error, Result};

/// The first process records its config; every later one must bring the same.
pub fn check_config(store: &RunStore, config: &str) -> Result<()> {
    let created = store.rt.block_on(store.kv.create("run.config", config.to_string().into_bytes().into()));
    match created {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
            let run_config = store.config()?.unwrap_or_default();
            let differences = config_differences(&run_config, config);
            if differences.is_empty() {
                return Ok(());
            }
            Err(Error::config(
                "training config",
                format!(
                    "run {:?} on {} was started with a different config; every process of a run needs the \
                     same one (only --host and --out differ):\n  {}\nTo start the run over with this config, \
                     remove it once none of its processes runs: `hacpo cluster remove --nats {} --run {}`",
                    store.run,
                    store.url,
                    differences.join("\n  "),
                    store.url,
                    store.run
                ),
            ))
        }
        Err(e) => Err(store.trouble("record the run's config", &e)),
    }
}

/// This process's claim on its host, as last written, and whether another process has taken
/// the host over since.
pub struct Membership {
    kv: kv::Store,
    key: String,
    claim: Mutex<Claim>,
    /// The revision of our last write: the next one must replace exactly it.
    revision: Mutex<u64>,
    /// Set when a write found another process's claim in our place.
    lost: Mutex<Option<String>>,
    /// Time between heartbeats.
    every: Duration,
}

impl Membership {
    /// Claims `claim.host`, atomically against a process doing the same: refused while another
    /// process holds it, and, without `resume`, when it trained a step before.
    pub fn join(store: &RunStore, claim: Claim, resume: bool, every: Duration) -> Result<Arc<Membership>> {
        let key = format!("host.{}", claim.host);
        let bytes: bytes::Bytes = serde_json::to_vec(&claim).expect("a claim serialises").into();
        let mut last_error = String::new();
        for attempt in 0..5 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(200 * attempt));
            }
            let entry =
                store.rt.block_on(store.kv.entry(key.clone())).map_err(|e| store.trouble("read a claim", &e))?;
            let written = match entry.filter(|e| e.operation == kv::Operation::Put) {
                None => store.rt.block_on(store.kv.create(&key, bytes.clone())).map_err(|e| e.to_string()),
                Some(e) => {
                    if let Ok(held) = serde_json::from_slice::<Claim>(&e.value) {
                        refuse_held(store, &held, resume)?;
                    }
                    store.rt.block_on(store.kv.update(&key, bytes.clone(), e.revision)).map_err(|e| e.to_string())
                }
            };
            match written {
                Ok(revision) => {
                    return Ok(Arc::new(Membership {
                        kv: store.kv.clone(),
                        key,
                        claim: Mutex::new(claim),
                        revision: Mutex::new(revision),
                        lost: Mutex::new(None),
                        every,
                    }));
                }
                // Another process wrote the key between our read and write, or the server
                // hiccuped: read it again.
                Err(e) => last_error = e,
            }
        }
        Err(store.trouble(&format!("claim host {}", claim.host), &last_error))
    }

    /// Records the step reached; the next heartbeat carries it.
    pub fn reached(&self, step: u64) {
        self.claim.lock().expect("claim").step = step;
    }

    /// Why this process no longer holds its host, if another took it over.
    pub fn lost(&self) -> Option<String> {
        self.lost.lock().expect("lost").clone()
    }

    /// Writes the claim in place of our last write. A server that cannot be reached is
    /// harmless (the next write lands); a claim that is not ours any more marks the host lost.
    pub async fn write(&self, state: ClaimState) {
        if self.lost().is_some() {
            return;
        }
        let claim = {
            let mut c = self.claim.lock().expect("claim");
            c.state = state;
            c.heartbeat_ms = now_ms();
            c.clone()
        };
        let bytes = serde_json::to_vec(&claim).expect("a claim serialises");
        let revision = *self.revision.lock().expect("revision");
        match self.kv.update(&self.key, bytes.into(), revision).await {
            Ok(r) => *self.revision.lock().expect("revision") = r,
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                let now = self.kv.get(&self.key).await.ok().flatten();
                let other = now.and_then(|v| serde_json::from_slice::<Claim>(&v).ok());
                let who = other.map(|c| format!("process {}", c.process())).unwrap_or_else(|| "another process".into());
                *self.lost.lock().expect("lost") = Some(format!("{who} took host {} over", claim.host));
            }
            Err(_) => {}
        }
    }

    /// Heartbeats until aborted or the host is lost.
    pub async fn beat(self: Arc<Self>) {
        while self.lost().is_none() {
            tokio::time::sleep(self.every).await;
            self.write(ClaimState::Running).await;
        }
    }
}

/// The error for a host another live process holds, or that trained before when not resuming.
fn refuse_held(store: &RunStore, held: &Claim, resume: bool) -> Result<()> {
    let now = now_ms();
    if store.alive(held)? {
        return Err(Error::InvalidArgument(format!(
            "host {} of run {:?} is already hosted by process {} (at step {}, heartbeat {:.0} s ago by its \
             clock); stop that process, or start this one with another --host",
            held.host,
            store.run,
            held.process(),
            held.step,
            held.age_s(now)
        )));
    }
    // A process that stopped before its first step may simply be started again.
    if !resume && held.step > 0 {
        return Err(Error::InvalidArgument(format!(
            "host {} of run {:?} trained before (process {}, step {}); continue it with \
             `hacpo train --resume ITS_RUN_DIR --host {}`, or start a new run: another cluster.run, or \
             `hacpo cluster remove --nats {} --run {}`",
            held.host,
            store.run,
            held.process(),
            held.step,
            held.host,
            store.url,
            store.run
        )));
    }
    Ok(())
}
