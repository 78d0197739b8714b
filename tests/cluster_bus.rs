//! The cluster bus against a real `nats-server -js` (tests/common/nats_server.rs): every host
//! gets every part of a phase in host order; a part over the payload limit goes through the
//! object store; a second claim on a host, a different config, a host that ran before without
//! `--resume` are refused with exit code 2; a missing host ends the wait by name; a server
//! restart loses nothing; a resumed host replays what it lost; weight snapshots round-trip.

mod common;

use std::time::{Duration, Instant};

use common::nats_server::NatsServer;
use hacpo::cluster::nats::{JoinSettings, NatsBus};
use hacpo::cluster::{Bus, ClusterConfig, HostConfig};

const CONFIG: &str = "[algo]\nname = \"hacpo\"\n[run]\nsteps = 3\n";

fn cluster(server: &NatsServer, run: &str, hosts: &[&str]) -> ClusterConfig {
    ClusterConfig {
        nats: server.url(),
        run: run.to_string(),
        timeout_s: 30.0,
        hosts: hosts
            .iter()
            .enumerate()
            .map(|(k, h)| HostConfig { name: h.to_string(), policies: vec![format!("p{k}")] })
            .collect(),
    }
}

fn join(cluster: &ClusterConfig, host: &str, resume: bool) -> hacpo::Result<NatsBus> {
    NatsBus::join(&JoinSettings { cluster, host, config: CONFIG, resume })
}

/// Each host, on its own thread, gathers `steps` steps of one phase; returns what each saw.
fn gather_all(
    cluster: &ClusterConfig,
    steps: u64,
    part: impl Fn(usize, u64) -> Vec<u8> + Sync,
) -> Vec<Vec<Vec<Vec<u8>>>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = cluster
            .hosts
            .iter()
            .enumerate()
            .map(|(k, h)| {
                let part = &part;
                s.spawn(move || {
                    let bus = join(cluster, &h.name, false).unwrap();
                    (1..=steps).map(|step| bus.all_gather(step, "rollout", part(k, step)).unwrap()).collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn every_host_gets_every_part_in_host_order() {
    let server = NatsServer::start();
    let c = cluster(&server, "trio", &["a", "b", "c"]);
    let part = |k: usize, step: u64| vec![k as u8, step as u8, 7];
    let seen = gather_all(&c, 3, part);
    for (k, host) in seen.iter().enumerate() {
        for (i, parts) in host.iter().enumerate() {
            let step = i as u64 + 1;
            let want: Vec<Vec<u8>> = (0..3).map(|j| part(j, step)).collect();
            assert_eq!(parts, &want, "host {k}, step {step}");
        }
    }
    // The processes let go of their hosts when they ended; the status says so.
    let status = hacpo::cluster::store::status(&server.url(), "trio").unwrap();
    assert_eq!(status.claims.iter().map(|c| c.host.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
    assert!(status.claims.iter().all(|c| c.state == hacpo::cluster::ClaimState::Stopped), "{status:?}");
    // Removed, the run is gone, and its name starts a new run with none of its parts.
    hacpo::cluster::store::remove(&server.url(), "trio").unwrap();
    let gone = hacpo::cluster::store::status(&server.url(), "trio").unwrap_err().to_string();
    assert!(gone.contains("has no run \"trio\""), "{gone}");
    let again = gather_all(&c, 1, |k, _| vec![k as u8 + 100]);
    assert_eq!(again[0][0], vec![vec![100], vec![101], vec![102]]);
}

#[test]
fn a_part_over_the_payload_limit_goes_through_the_object_store() {
    let server = NatsServer::start();
    let c = cluster(&server, "big", &["a", "b"]);
    // The server's default limit is 1 MiB per message.
    let part = |k: usize, _| (0..3_000_000u32).map(|i| (i as usize * 31 + k) as u8).collect::<Vec<u8>>();
    let seen = gather_all(&c, 1, part);
    for host in &seen {
        assert_eq!(host[0], vec![part(0, 1), part(1, 1)]);
    }
    // What the stream holds for it is a pointer, not the bytes.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
        let stream = js.get_stream("HACPO_big").await.unwrap();
        let m = stream.get_last_raw_message_by_subject("hacpo.big.rec.1.rollout.a").await.unwrap();
        assert!(m.payload.is_empty());
        assert!(m.headers.get("Hacpo-Object").unwrap().as_str().starts_with("rec/1/rollout/a/"));
    });
}

#[test]
fn a_host_is_claimed_once_and_continued_only_with_resume() {
    let server = NatsServer::start();
    let c = cluster(&server, "claims", &["a", "b"]);
    let first = join(&c, "a", false).unwrap();
    let Err(second) = join(&c, "a", false) else { panic!("a second process took host a") };
    assert_eq!(second.exit_code(), 2);
    let msg = second.to_string();
    assert!(msg.contains("already hosted by process") && msg.contains(&std::process::id().to_string()), "{msg}");
    // A process that stopped before its first step may start again as it was started.
    drop(first);
    let first = join(&c, "a", false).unwrap();
    first.reached(1);
    drop(first);
    let Err(again) = join(&c, "a", false) else { panic!("host a started again without --resume") };
    assert_eq!(again.exit_code(), 2);
    assert!(again.to_string().contains("--resume") && again.to_string().contains("hacpo cluster remove"), "{again}");
    join(&c, "a", true).unwrap();
    let Err(unknown) = join(&c, "z", false) else { panic!("an unknown host joined") };
    assert!(unknown.to_string().contains("a, b"), "{unknown}");
}

#[test]
fn a_process_with_another_config_is_refused_with_the_difference() {
    let server = NatsServer::start();
    let c = cluster(&server, "configs", &["a", "b"]);
    let _a = join(&c, "a", false).unwrap();
    let other = "[algo]\nname = \"grpo\"\n[run]\nsteps = 3\n";
    let Err(e) = NatsBus::join(&JoinSettings { cluster: &c, host: "b", config: other, resume: false }) else {
        panic!("a process with another config joined")
    };
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().contains("algo.name: the run has \"hacpo\", this process \"grpo\""), "{e}");
}

#[test]
fn a_missing_host_ends_the_wait_by_name() {
    let server = NatsServer::start();
    let mut c = cluster(&server, "alone", &["a", "b"]);
    c.timeout_s = 1.5;
    let a = join(&c, "a", false).unwrap();
    let started = Instant::now();
    let e = a.all_gather(1, "rollout", vec![1]).unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(1400));
    let msg = e.to_string();
    assert!(
        msg.contains("host b")
            && msg.contains("no process has joined")
            && msg.contains("--resume ITS_RUN_DIR --host b"),
        "{msg}"
    );
}

#[test]
fn the_run_goes_on_through_a_server_restart() {
    let mut server = NatsServer::start();
    let c = cluster(&server, "restart", &["a", "b"]);
    let a = join(&c, "a", false).unwrap();
    let b = join(&c, "b", false).unwrap();
    let first = std::thread::scope(|s| {
        let h = s.spawn(|| a.all_gather(1, "rollout", vec![0]).unwrap());
        assert_eq!(b.all_gather(1, "rollout", vec![1]).unwrap(), vec![vec![0], vec![1]]);
        h.join().unwrap()
    });
    assert_eq!(first, vec![vec![0], vec![1]]);
    // Host a publishes step 2, then the server dies and comes back on its file store.
    let second = std::thread::scope(|s| {
        let h = s.spawn(|| a.all_gather(2, "rollout", vec![2]).unwrap());
        std::thread::sleep(Duration::from_millis(300));
        server.kill();
        std::thread::sleep(Duration::from_millis(500));
        server.restart();
        assert_eq!(b.all_gather(2, "rollout", vec![3]).unwrap(), vec![vec![2], vec![3]]);
        h.join().unwrap()
    });
    assert_eq!(second, vec![vec![2], vec![3]]);
    // Step 1's parts survived the restart too.
    assert_eq!(a.all_gather(1, "rollout", vec![9]).unwrap(), vec![vec![0], vec![1]], "a part is published once");
}

#[test]
fn a_resumed_host_replays_the_steps_it_lost() {
    let server = NatsServer::start();
    let c = cluster(&server, "replay", &["a", "b"]);
    let a = join(&c, "a", false).unwrap();
    let b = join(&c, "b", false).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            for step in 1..=2 {
                a.all_gather(step, "rollout", vec![10 + step as u8]).unwrap();
            }
        });
        for step in 1..=2 {
            b.all_gather(step, "rollout", vec![20 + step as u8]).unwrap();
        }
    });
    // Host b's process dies; a new one resumes from its checkpoint at step 0 and replays.
    drop(b);
    let b = join(&c, "b", true).unwrap();
    for step in 1..=2u64 {
        let parts = b.all_gather(step, "rollout", vec![20 + step as u8]).unwrap();
        assert_eq!(parts, vec![vec![10 + step as u8], vec![20 + step as u8]]);
    }
}

#[test]
fn a_weight_snapshot_loads_in_another_process_as_published() {
    let server = NatsServer::start();
    let c = cluster(&server, "snapshots", &["a", "b"]);
    let a = join(&c, "a", false).unwrap();
    let b = join(&c, "b", false).unwrap();
    let agent =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny/pretrained/tiny-qwen-4d6251e7ff849352");
    a.publish_snapshot("p0", 3, &agent).unwrap();
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("p0-v3");
    b.fetch_snapshot("p0", 3, &dest).unwrap();
    for entry in std::fs::read_dir(&agent).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(dest.join(name)).unwrap(), "{name:?}");
    }
    let (want, got) = (
        hacpo::model::load::<hacpo::backend::Cpu>(agent.to_str().unwrap(), &common::device()).unwrap(),
        hacpo::model::load::<hacpo::backend::Cpu>(dest.to_str().unwrap(), &common::device()).unwrap(),
    );
    let ids = want.tokenizer.encode("2 + 3 =", false).unwrap();
    assert_eq!(common::full_logits(&want.model, &ids), common::full_logits(&got.model, &ids));
    let Err(missing) = b.fetch_snapshot("p0", 4, &out.path().join("v4")) else { panic!("version 4 exists") };
    assert!(missing.to_string().contains("no snapshot of policy \"p0\" at version 4"), "{missing}");
    assert!(b.fetch_snapshot("p0", 3, &dest).is_err(), "an existing directory is not overwritten");
}

#[test]
fn a_slow_host_that_beats_is_waited_for_past_the_timeout() {
    let server = NatsServer::start();
    let mut c = cluster(&server, "slow", &["a", "b"]);
    c.timeout_s = 1.5;
    let a = join(&c, "a", false).unwrap();
    let b = join(&c, "b", false).unwrap();
    let started = Instant::now();
    let parts = std::thread::scope(|s| {
        let waiting = s.spawn(|| a.all_gather(1, "rollout", vec![0]));
        // Host b works for 6 s (its heartbeats go on), four times the timeout, then publishes.
        std::thread::sleep(Duration::from_secs(6));
        b.all_gather(1, "rollout", vec![1]).unwrap();
        waiting.join().unwrap()
    });
    assert_eq!(parts.unwrap(), vec![vec![0], vec![1]]);
    assert!(started.elapsed() >= Duration::from_secs(6));
}

#[test]
fn a_process_whose_host_was_taken_over_stops() {
    let server = NatsServer::start();
    let c = cluster(&server, "takeover", &["a", "b"]);
    let a = join(&c, "a", false).unwrap();
    // Another process (on another machine) claims host a, as after this one was paused long
    // enough to look dead.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
        let kv = js.get_key_value("HACPO_takeover").await.unwrap();
        let claim = serde_json::json!({"host": "a", "policies": ["p0"], "pid": 4242, "machine": "elsewhere",
            "step": 0, "state": "running", "heartbeat_ms": 0});
        kv.put("host.a", serde_json::to_vec(&claim).unwrap().into()).await.unwrap();
    });
    // Its next heartbeat finds the claim changed under it.
    std::thread::sleep(Duration::from_secs(3));
    let e = a.all_gather(1, "rollout", vec![0]).unwrap_err().to_string();
    assert!(e.contains("process 4242@elsewhere took host a over"), "{e}");
    drop(a);
    // It did not mark the new owner's claim stopped on its way out.
    let status = hacpo::cluster::store::status(&server.url(), "takeover").unwrap();
    assert_eq!(status.claims[0].pid, 4242);
    assert_eq!(status.claims[0].state, hacpo::cluster::ClaimState::Running);
}
