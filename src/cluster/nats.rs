//! The NATS JetStream bus: a host's part of a phase is one message on its own subject of the
//! run's stream (`super::store`), read back by subject and never consumed, so a process that
//! resumes replays the steps it lost and a server restart loses nothing. The first part
//! published on a subject is the one everybody reads: a replayed step's part is refused by
//! the server, so a resumed process can never hand its peers different samples than those
//! they already trained on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream;
use tokio::io::AsyncReadExt;

use super::claims::{Claim, ClaimState, HEARTBEAT_S, machine_name, now_ms};
use super::membership::{Membership, check_config};
use super::store::{RunStore, stream_name};
use super::{Bus, ClusterConfig, is_token};
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
    /// Continue a host that trained before (`--resume`); without it such a host is refused.
    pub resume: bool,
}

/// One process's membership of a run on a NATS server.
pub struct NatsBus {
    store: RunStore,
    records: stream::Stream,
    host: String,
    hosts: Vec<String>,
    /// How long a host may stay silent (no part, no heartbeat) before a wait for it ends.
    timeout: Duration,
    /// Time between heartbeats: at most [`HEARTBEAT_S`], and a quarter of the timeout, so a
    /// live host always beats within it.
    heartbeat_every: Duration,
    max_inline: usize,
    membership: Arc<Membership>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
}

impl NatsBus {
    /// Joins the run as `settings.host`: checks the config against the run's, claims the host
    /// (refusing one another live process holds, or one that trained before without
    /// `resume`), and starts the heartbeats.
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
        let timeout = Duration::from_secs_f64(cluster.timeout_s);
        let heartbeat_every = (timeout / 4).min(Duration::from_secs_f64(HEARTBEAT_S));
        let membership = Membership::join(&store, claim, settings.resume, heartbeat_every)?;
        let records = store
            .rt
            .block_on(store.js.get_stream(stream_name(&cluster.run)))
            .map_err(|e| store.trouble("open the records stream", &e))?;
        let max_inline = store.client.server_info().max_payload.saturating_sub(PAYLOAD_HEADROOM).max(1024);
        let heartbeat = Some(store.rt.spawn(membership.clone().beat()));
        Ok(NatsBus {
            records,
            host: host.name.clone(),
            hosts: cluster.hosts.iter().map(|h| h.name.clone()).collect(),
            timeout,
            heartbeat_every,
            max_inline,
            membership,
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

    /// Publishes this host's part unless one is already there, through the object store when
    /// it is over the payload limit; retried (the server may be restarting) until `deadline`.
    async fn publish(&self, step: u64, phase: &str, mine: Vec<u8>, deadline: Instant) -> Result<()> {
        let subject = self.subject(step, phase, &self.host);
        loop {
            // An object of its own per attempt: a part already stored keeps pointing at its own.
            let object = (mine.len() > self.max_inline)
                .then(|| format!("rec/{step}/{phase}/{}/{}-{}", self.host, std::process::id(), now_ms()));
            let attempt = async {
                let mut headers = HeaderMap::new();
                // Only onto an empty subject: the first part stays the part.
                headers.insert(async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, "0");
                let payload = match &object {
                    Some(name) => {
                        self.store
                            .objects
                            .put(name.as_str(), &mut mine.as_slice())
                            .await
                            .map_err(|e| (None, e.to_string()))?;
                        headers.insert(OBJECT_HEADER, name.as_str());
                        Vec::new()
                    }
                    None => mine.clone(),
                };
                let ack = self
                    .store
                    .js
                    .publish_with_headers(subject.clone(), headers, payload.into())
                    .await
                    .map_err(|e| (Some(e.kind()), e.to_string()))?;
                ack.await.map(|_| ()).map_err(|e| (Some(e.kind()), e.to_string()))
            };
            match attempt.await {
                Ok(()) => return Ok(()),
                // Published before (by this host's earlier life, or by this call before a lost
                // acknowledgement): that part stands.
                Err((Some(PublishErrorKind::WrongLastSequence), _)) => {
                    if let Some(name) = &object {
                        let _ = self.store.objects.delete(name).await;
                    }
                    return Ok(());
                }
                Err((_, e)) if Instant::now() >= deadline => {
                    return Err(self.store.trouble(&format!("store step {step}'s {phase} part"), &e));
                }
                Err((_, e)) => {
                    tracing::warn!("publishing step {step}'s {phase} part failed ({e}); retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }

    /// `host`'s part of `phase` in `step`. The wait ends when `host` has been silent (no part,
    /// its claim unchanged) for the timeout: a slow host that beats is waited for.
    async fn read(&self, step: u64, phase: &str, host: &str) -> Result<Vec<u8>> {
        let subject = self.subject(step, phase, host);
        let started = Instant::now();
        let mut deadline = started + self.timeout;
        let mut pause = Duration::from_millis(1);
        let mut waiting: Option<crate::progress::Progress> = None;
        let (mut looked, mut revision) = (None::<Instant>, None::<u64>);
        loop {
            match self.records.get_last_raw_message_by_subject(&subject).await {
                Ok(m) => match self.unpack(m.headers, m.payload.to_vec()).await {
                    Ok(bytes) => return Ok(bytes),
                    Err(e) => tracing::warn!("reading {subject}'s object failed ({e}); retrying"),
                },
                Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {}
                Err(e) => tracing::warn!("reading {subject} failed ({e}); retrying"),
            }
            if looked.is_none_or(|t| t.elapsed() > self.heartbeat_every) {
                looked = Some(Instant::now());
                let (now_revision, line) = self.heartbeat_of(host).await;
                if now_revision.is_some() && now_revision != revision {
                    // It beat since we last looked: it is alive, the silence starts again.
                    (revision, deadline) = (now_revision, Instant::now() + self.timeout);
                }
                if started.elapsed() > Duration::from_secs(3) {
                    waiting
                        .get_or_insert_with(|| crate::progress::Progress::new(format!("waiting for host {host}"), 0))
                        .set_message(format!("step {step}, {phase}: {line}"));
                }
            }
            if Instant::now() >= deadline {
                return Err(self.missing(step, phase, host).await);
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

    /// `host`'s claim revision (it changes with every heartbeat) and a line on how it is doing.
    async fn heartbeat_of(&self, host: &str) -> (Option<u64>, String) {
        let entry = match self.store.kv.entry(format!("host.{host}")).await {
            Ok(e) => e,
            Err(_) => return (None, "its heartbeat cannot be read (the server is unreachable)".into()),
        };
        let revision = entry.as_ref().map(|e| e.revision);
        let claim = entry.and_then(|e| serde_json::from_slice::<Claim>(&e.value).ok());
        let line = match claim {
            Some(c) if c.state == ClaimState::Stopped => {
                format!("its process {} stopped at step {}", c.process(), c.step)
            }
            Some(c) => format!("{} at step {}, heartbeat {:.0} s ago", c.process(), c.step, c.age_s(now_ms())),
            None => "no process has joined as it yet".into(),
        };
        (revision, line)
    }

    /// The error that ends a wait for `host`.
    async fn missing(&self, step: u64, phase: &str, host: &str) -> Error {
        Error::PeerFailed {
            peer: format!("host {host}"),
            message: format!(
                "it published no step {step} {phase} part and no heartbeat for cluster.timeout_s = {} s ({}). \
                 Start it (`hacpo train --config ... --host {host}`, or `hacpo train --resume ITS_RUN_DIR \
                 --host {host}` if it trained before), then resume this process with `--resume`: every \
                 part published so far stays on the server",
                self.timeout.as_secs_f64(),
                self.heartbeat_of(host).await.1
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
        if let Some(why) = self.membership.lost() {
            return Err(Error::PeerFailed {
                peer: format!("host {}", self.host),
                message: format!("{why} while this process was not heard from; this process stops"),
            });
        }
        self.store.rt.block_on(async {
            self.publish(step, phase, mine, Instant::now() + self.timeout).await?;
            let mut parts = Vec::with_capacity(self.hosts.len());
            for host in &self.hosts {
                parts.push(self.read(step, phase, host).await?);
            }
            Ok(parts)
        })
    }

    fn reached(&self, step: u64) {
        self.membership.reached(step);
    }
}

impl Drop for NatsBus {
    /// Lets go of the host (unless another process took it over), so `hacpo cluster status`
    /// shows the process stopped and a restart need not wait.
    fn drop(&mut self) {
        let heartbeat = self.heartbeat.take();
        let membership = self.membership.clone();
        self.store.rt.block_on(async move {
            if let Some(h) = heartbeat {
                h.abort();
                let _ = h.await;
            }
            let _ = tokio::time::timeout(Duration::from_secs(2), membership.write(ClaimState::Stopped)).await;
        });
    }
}
