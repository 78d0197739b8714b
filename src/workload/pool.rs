//! The rollout pool: every policy thread receives every sample of the step.
//!
//! Each thread holds an [`Endpoint`]: it publishes its samples to every thread's channel (its
//! own included), announces that it is done, then collects until every thread is done — the
//! barrier that ends the rollout. A thread that fails, or panics (a drop guard notices), is
//! announced to all, and everyone else returns [`Error::PeerFailed`] naming it instead of
//! waiting forever; the failing thread returns its own error, which the caller reports.

use crossbeam_channel::{Receiver, Sender, unbounded};

use crate::error::{Error, Result};

enum Msg<T> {
    Items(Vec<T>),
    Done(usize),
    Failed(String, String),
}

/// Channels for `n` agents.
pub struct RolloutPool<T> {
    senders: Vec<Sender<Msg<T>>>,
    receivers: Vec<Receiver<Msg<T>>>,
}

impl<T: Clone + Send> RolloutPool<T> {
    pub fn new(n: usize) -> Self {
        let (senders, receivers) = (0..n).map(|_| unbounded()).unzip();
        RolloutPool { senders, receivers }
    }

    /// Agent `k`'s side of the pool.
    pub fn endpoint(&self, k: usize) -> Endpoint<T> {
        Endpoint { k, senders: self.senders.clone(), receiver: self.receivers[k].clone(), finished: false }
    }
}

/// One agent's side of the pool.
pub struct Endpoint<T> {
    k: usize,
    senders: Vec<Sender<Msg<T>>>,
    receiver: Receiver<Msg<T>>,
    finished: bool,
}

impl<T: Clone + Send> Endpoint<T> {
    /// Sends `items` to every agent.
    pub fn publish(&self, items: Vec<T>) {
        for s in &self.senders {
            let _ = s.send(Msg::Items(items.clone()));
        }
    }

    /// Announces that this agent has published everything.
    pub fn finish(&mut self) {
        self.finished = true;
        for s in &self.senders {
            let _ = s.send(Msg::Done(self.k));
        }
    }

    /// Announces this thread's failure (`who` names it) to every thread.
    pub fn fail(&mut self, who: &str, message: String) {
        self.finished = true;
        for s in &self.senders {
            let _ = s.send(Msg::Failed(who.to_string(), message.clone()));
        }
    }

    /// Waits until every agent is done and returns all items received (in arrival order).
    pub fn collect(&self) -> Result<Vec<T>> {
        let n = self.senders.len();
        let mut done = vec![false; n];
        let mut items = Vec::new();
        while done.iter().any(|d| !d) {
            match self.receiver.recv() {
                Ok(Msg::Items(v)) => items.extend(v),
                Ok(Msg::Done(j)) => done[j] = true,
                Ok(Msg::Failed(peer, message)) => return Err(Error::PeerFailed { peer, message }),
                Err(_) => return Err(Error::Internal("the rollout pool closed before every agent finished".into())),
            }
        }
        Ok(items)
    }
}

impl<T> Drop for Endpoint<T> {
    /// A thread that unwinds before finishing tells the others, so nobody waits forever.
    fn drop(&mut self) {
        if !self.finished {
            for s in &self.senders {
                let _ = s.send(Msg::Failed(format!("thread {}", self.k), "it stopped unexpectedly (panic)".into()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everyone_receives_everything() {
        let pool = RolloutPool::<u32>::new(3);
        let results: Vec<Result<Vec<u32>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|k| {
                    let mut ep = pool.endpoint(k);
                    s.spawn(move || {
                        ep.publish(vec![k as u32 * 10, k as u32 * 10 + 1]);
                        ep.finish();
                        ep.collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in results {
            let mut v = r.unwrap();
            v.sort();
            assert_eq!(v, vec![0, 1, 10, 11, 20, 21]);
        }
    }

    #[test]
    fn a_failing_agent_ends_the_phase_with_an_error() {
        let pool = RolloutPool::<u32>::new(2);
        let results: Vec<std::thread::Result<Result<Vec<u32>>>> = std::thread::scope(|s| {
            let mut ep0 = pool.endpoint(0);
            let ep1 = pool.endpoint(1);
            let a = s.spawn(move || {
                ep0.publish(vec![1]);
                ep0.finish();
                ep0.collect()
            });
            let b = s.spawn(move || -> Result<Vec<u32>> {
                let _keep = ep1;
                panic!("boom");
            });
            vec![a.join(), b.join()]
        });
        let err = results[0].as_ref().unwrap().as_ref().unwrap_err().to_string();
        assert!(err.contains("thread 1") && err.contains("panic"), "{err}");
        assert!(results[1].is_err());
    }
}
