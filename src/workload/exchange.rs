//! HACPO's workload (docs/algorithms.md §2.2): every policy that plays the role answers every
//! prompt G times on its own thread and publishes its samples to the [`RolloutPool`], so each
//! policy receives everyone's; rewards come from the task's verifier.
//!
//! EOS handling follows docs/algorithms.md §2.6 ([`super::response`]).

use std::sync::Arc;

use burn::tensor::backend::Backend;
use rayon::prelude::*;

use super::pool::RolloutPool;
use super::roles::{Role, RoleMap};
use super::{Rollout, RolloutSettings, RolloutTimings, ValidationSettings, Workload, sample_in_chunks};
use crate::error::{Error, Result};
use crate::generate::greedy_responses;
use crate::policy::{Policy, per_policy};
use crate::sample::{GroupKey, Sample};
use crate::stable_hash::mix_seed;
use crate::task::{Task, TaskPrompt};
use crate::train::metrics::Metrics;

/// Every policy of one role answers every prompt; all samples go to everyone.
pub struct Exchange {
    pub task: Arc<dyn Task>,
    pub role: Role,
}

impl Exchange {
    /// The exchange of `task`: one role, played by every policy.
    pub fn new(roles: &RoleMap, task: Arc<dyn Task>) -> Result<Self> {
        let names = &roles.policies;
        let mut roles = roles.shared();
        if roles.len() != 1 {
            return Err(Error::config(
                "training config",
                format!(
                    "roles: the exchange workload has one role (every policy answers the task), found {}",
                    roles.len()
                ),
            ));
        }
        let role = roles.remove(0);
        if let Some(k) = (0..names.len()).find(|k| !role.policies.contains(k)) {
            return Err(Error::config(
                "training config",
                format!(
                    "roles[0].policies: every policy plays the exchange workload's one role, but {:?} does not; \
                     add it to the role or remove it from [[policies]]",
                    names[k]
                ),
            ));
        }
        Ok(Exchange { task, role })
    }

    /// The group of a prompt's answers: the task's id, the role, and the prompt's position in
    /// the step (an epoch boundary may put one task twice into a step).
    pub fn group_key(&self, prompt: &TaskPrompt, position: usize) -> GroupKey {
        GroupKey::new(&[&self.role.name, &prompt.id, &position.to_string()])
    }
}

impl<B: Backend> Workload<B> for Exchange {
    fn name(&self) -> &str {
        "exchange"
    }

    fn validation_key(&self) -> &'static str {
        "val/accuracy"
    }

    /// Greedy accuracy of every policy this process holds on the held-out prompts, generated concurrently
    /// (one thread per policy, as scoring does: one policy's generation does not fill the cores).
    fn validate(&self, policies: &[Policy<B>], settings: &ValidationSettings) -> Result<Vec<Metrics>> {
        let held_out = self.task.validation();
        let prompts: Vec<Vec<Vec<u32>>> = policies
            .iter()
            .map(|p| {
                held_out.iter().map(|q| p.encode_prompt(&self.role.messages(q), settings.max_prompt_tokens)).collect()
            })
            .collect::<Result<_>>()?;
        let texts =
            per_policy(policies.iter().zip(&prompts).map(|(p, ids)| (p.index, (p, ids))), "validation", |(p, ids)| {
                greedy_responses(
                    &p.inference_model(),
                    &p.tokenizer,
                    &p.eos_token_ids,
                    ids,
                    settings.max_new_tokens,
                    settings.batch_prompts,
                )
            });
        let mut out = vec![Metrics::new(); settings.policies];
        for (p, t) in policies.iter().zip(texts) {
            let correct: f64 = held_out.iter().zip(&t?).map(|(p, t)| self.task.reward(p, t)).sum();
            out[p.index] = Metrics::from([("val/accuracy".to_string(), correct / held_out.len().max(1) as f64)]);
        }
        Ok(out)
    }

    fn rollout(&self, policies: &[Policy<B>], prompts: &[TaskPrompt], settings: &RolloutSettings) -> Result<Rollout> {
        // In a cluster run the other hosts sample their policies; the trainer gathers the step.
        let players: Vec<&Policy<B>> =
            self.role.policies.iter().filter_map(|&k| policies.iter().find(|p| p.index == k)).collect();
        let pool = RolloutPool::<Sample>::new(players.len());
        let results: Vec<Result<(Vec<Sample>, RolloutTimings)>> = std::thread::scope(|s| {
            let handles: Vec<_> = players
                .iter()
                .enumerate()
                .map(|(slot, policy)| {
                    let mut endpoint = pool.endpoint(slot);
                    s.spawn(move || {
                        crate::backend::on_lane(policy.index, || {
                            let _span =
                                tracing::info_span!("rollout", policy = %policy.name, step = settings.step).entered();
                            match self.sample(policy, prompts, settings) {
                                Ok((mine, timings)) => {
                                    endpoint.publish(mine);
                                    endpoint.finish();
                                    endpoint.collect().map(|all| (all, timings))
                                }
                                Err(e) => {
                                    endpoint.fail(&policy.name, e.to_string());
                                    Err(e)
                                }
                            }
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Error::Internal("a rollout thread panicked".into()))))
                .collect()
        });
        let mut samples = None;
        let mut timings = vec![RolloutTimings::default(); settings.policies];
        let mut first_error = None;
        for (slot, r) in results.into_iter().enumerate() {
            match r {
                Ok((all, t)) => {
                    timings[players[slot].index] = t;
                    samples.get_or_insert(all);
                }
                Err(e) => first_error = Some(crate::error::root_cause(first_error, e)),
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok(Rollout { samples: samples.unwrap_or_default(), timings, metrics: Metrics::new() })
    }

    fn assign_rewards(&self, samples: &mut [Sample], prompts: &[TaskPrompt]) -> Result<()> {
        let task = self.task.as_ref();
        samples.par_iter_mut().for_each(|s| s.reward = Some(task.reward(&prompts[s.prompt], &s.text)));
        Ok(())
    }
}

impl Exchange {
    /// `settings.group_size` responses of `policy` to every prompt.
    fn sample<B: Backend>(
        &self,
        policy: &Policy<B>,
        prompts: &[TaskPrompt],
        settings: &RolloutSettings,
    ) -> Result<(Vec<Sample>, RolloutTimings)> {
        let mut timings = RolloutTimings::default();
        let messages: Vec<_> = prompts.iter().map(|p| self.role.messages(p)).collect();
        let prompt_ids: Vec<Vec<u32>> =
            messages.iter().map(|m| policy.encode_prompt(m, settings.max_prompt_tokens)).collect::<Result<_>>()?;
        let seed = mix_seed(&[settings.run_seed, settings.step, policy.index as u64]);
        let drawn = sample_in_chunks(
            policy,
            &prompt_ids,
            settings,
            settings.group_size,
            |c| mix_seed(&[seed, c as u64]),
            &mut timings,
        )?;
        let out = drawn
            .into_iter()
            .map(|d| Sample {
                role: self.role.name.clone(),
                group: self.group_key(&prompts[d.prompt], d.prompt),
                sample_index: d.sample_index,
                ..Sample::new(
                    policy.index,
                    policy.version,
                    d.prompt,
                    messages[d.prompt].clone(),
                    prompt_ids[d.prompt].clone(),
                    d.response,
                )
            })
            .collect();
        Ok((out, timings))
    }
}
