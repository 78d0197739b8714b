//! HACPO's workload (ALGORITHMS.md §2.2): every policy that plays the role answers every
//! prompt G times on its own thread and publishes its samples to the [`RolloutPool`], so each
//! policy receives everyone's; rewards come from the task's verifier.
//!
//! EOS handling follows ALGORITHMS.md §2.6 ([`super::response`]).

use std::sync::Arc;

use burn::tensor::backend::Backend;
use rayon::prelude::*;

use super::pool::RolloutPool;
use super::{Role, RolloutSettings, RolloutTimings, ValidationSettings, Workload, mix_seed, sample_in_chunks};
use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::generate::greedy_responses;
use crate::policy::{Policy, per_policy};
use crate::sample::{GroupKey, Sample};
use crate::task::{Task, TaskPrompt};
use crate::train::metrics::Metrics;

/// Every policy of one role answers every prompt; all samples go to everyone.
pub struct Exchange {
    pub task: Arc<dyn Task>,
    pub role: Role,
}

/// The roles of a config: `[[roles]]`, or every policy in the one role `solver`.
pub fn roles(cfg: &TrainConfig) -> Vec<Role> {
    if cfg.roles.is_empty() {
        return vec![Role { name: "solver".into(), policies: (0..cfg.policies.len()).collect(), template: None }];
    }
    cfg.roles
        .iter()
        .map(|r| Role {
            name: r.name.clone(),
            policies: if r.policies.is_empty() {
                (0..cfg.policies.len()).collect()
            } else {
                r.policies.iter().filter_map(|p| cfg.policy_index(p)).collect()
            },
            template: r.template.clone(),
        })
        .collect()
}

impl Exchange {
    /// The exchange of `cfg`: one role, played by every policy.
    pub fn new(cfg: &TrainConfig, task: Arc<dyn Task>) -> Result<Self> {
        let mut roles = roles(cfg);
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
        if let Some(k) = (0..cfg.policies.len()).find(|k| !role.policies.contains(k)) {
            return Err(Error::config(
                "training config",
                format!(
                    "roles[0].policies: every policy plays the exchange workload's one role, but {:?} does not; \
                     add it to the role or remove it from [[policies]]",
                    cfg.policy_name(k)
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

    /// Greedy accuracy of every policy on the held-out prompts, generated concurrently (one
    /// thread per policy, as scoring does: one policy's generation does not fill the cores).
    fn validate(&self, policies: &[Policy<B>], settings: &ValidationSettings) -> Result<Vec<Metrics>> {
        let held_out = self.task.validation();
        let prompts: Vec<Vec<Vec<u32>>> = policies
            .iter()
            .map(|p| {
                held_out.iter().map(|q| p.encode_prompt(&self.role.messages(q), settings.max_prompt_tokens)).collect()
            })
            .collect::<Result<_>>()?;
        let texts = per_policy(policies.iter().zip(&prompts), "validation", |(p, ids)| {
            greedy_responses(
                &p.inference_model(),
                &p.tokenizer,
                &p.eos_token_ids,
                ids,
                settings.max_new_tokens,
                settings.batch_prompts,
            )
        });
        texts
            .into_iter()
            .map(|t| {
                let correct: f64 = held_out.iter().zip(&t?).map(|(p, t)| self.task.reward(p, t)).sum();
                Ok(Metrics::from([("val/accuracy".to_string(), correct / held_out.len().max(1) as f64)]))
            })
            .collect()
    }

    fn rollout(
        &self,
        policies: &[Policy<B>],
        prompts: &[TaskPrompt],
        settings: &RolloutSettings,
    ) -> Result<(Vec<Sample>, Vec<RolloutTimings>)> {
        let players: Vec<&Policy<B>> = self.role.policies.iter().map(|&k| &policies[k]).collect();
        let pool = RolloutPool::<Sample>::new(players.len());
        let results: Vec<Result<(Vec<Sample>, RolloutTimings)>> = std::thread::scope(|s| {
            let handles: Vec<_> = players
                .iter()
                .enumerate()
                .map(|(slot, policy)| {
                    let mut endpoint = pool.endpoint(slot);
                    s.spawn(move || {
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
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Error::Internal("a rollout thread panicked".into()))))
                .collect()
        });
        let mut samples = None;
        let mut timings = vec![RolloutTimings::default(); policies.len()];
        let mut first_error = None;
        for (slot, r) in results.into_iter().enumerate() {
            match r {
                Ok((all, t)) => {
                    timings[self.role.policies[slot]] = t;
                    samples.get_or_insert(all);
                }
                Err(e) => first_error = Some(crate::error::root_cause(first_error, e)),
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok((samples.unwrap_or_default(), timings))
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
                id: 0,
                policy: policy.index,
                role: self.role.name.clone(),
                group: self.group_key(&prompts[d.prompt], d.prompt),
                parent: None,
                turn: 0,
                prompt: d.prompt,
                sample_index: d.sample_index,
                messages: messages[d.prompt].clone(),
                text: d.text,
                prompt_ids: prompt_ids[d.prompt].clone(),
                response_ids: d.response_ids,
                token_logps: vec![],
                values: vec![],
                reward: None,
                penalty: 0.0,
                score: None,
                train: true,
                policy_version: policy.version,
                finish_reason: d.finish_reason,
            })
            .collect();
        Ok((out, timings))
    }
}
