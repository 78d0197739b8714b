//! MAPPO's arithmetic, as MMOA-RAG runs it (TRL 0.9 PPO): each agent's output gets its reward
//! at its last token, a value head on the policy's own trunk estimates every token's value,
//! generalised advantage estimation (GAE) turns both into per-token advantages and returns,
//! and the advantages are whitened over the learner's whole batch (every role's tokens).
//!
//! ```text
//! δ_t = r_t + γ·V_{t+1} − V_t        (V after the last token = 0; r_t = 0 but r_T = R)
//! A_t = δ_t + γλ·A_{t+1}             returns_t = A_t + V_t (before whitening)
//! ```
//!
//! Pure arithmetic on plain vectors; the loss terms are `rl::algos::mappo`'s, the value head a
//! model part of `train::critic`.

use serde::{Deserialize, Serialize};

/// `[algo.mappo]`: the critic's settings (TRL 0.9's PPO defaults, which MMOA-RAG keeps).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CriticSettings {
    /// Discount per token.
    pub gamma: f64,
    /// GAE's λ.
    pub lam: f64,
    /// Weight of the value loss in the total loss.
    pub vf_coef: f64,
    /// The value prediction may move this far from the rollout's value before the loss clips.
    pub cliprange_value: f64,
    /// Whiten advantages over the learner's batch (zero mean, unit variance).
    pub whiten: bool,
    /// The value head's learning rate (AdamW, no weight decay, constant). The head starts at
    /// zero: at a policy's learning rate (1e-6 for an 8B model) it would stay near zero for a
    /// whole run and leave MAPPO without a baseline.
    pub critic_lr: f64,
    /// The value head reads the policy's own trunk (TRL 0.9, as MMOA-RAG runs it; the
    /// default) rather than a value model of its own initialised from the policy (verl,
    /// OpenRLHF). On the tiny search team the value model of its own learnt less (README).
    pub shared_trunk: bool,
}

impl Default for CriticSettings {
    fn default() -> Self {
        CriticSettings {
            gamma: 1.0,
            lam: 0.95,
            vf_coef: 0.1,
            cliprange_value: 0.2,
            whiten: true,
            critic_lr: 1e-3,
            shared_trunk: true,
        }
    }
}

impl CriticSettings {
    pub fn validate(&self) -> Result<(), String> {
        let unit = |x: f64| x.is_finite() && (0.0..=1.0).contains(&x);
        if !unit(self.gamma) || !unit(self.lam) {
            return Err(format!("gamma and lam must be in [0, 1], got {} and {}", self.gamma, self.lam));
        }
        if !(self.vf_coef.is_finite()
            && self.vf_coef >= 0.0
            && self.cliprange_value.is_finite()
            && self.cliprange_value > 0.0)
        {
            return Err("vf_coef must be ≥ 0 and cliprange_value > 0".into());
        }
        if !(self.critic_lr.is_finite() && self.critic_lr > 0.0) {
            return Err(format!("critic_lr must be a finite number > 0, got {}", self.critic_lr));
        }
        Ok(())
    }
}

/// GAE over one response whose reward `reward` arrives at its last token: (advantages,
/// returns), one per token.
pub fn gae(reward: f64, values: &[f32], gamma: f64, lam: f64) -> (Vec<f64>, Vec<f64>) {
    let n = values.len();
    let mut adv = vec![0.0; n];
    let mut next_value = 0.0;
    let mut next_adv = 0.0;
    for t in (0..n).rev() {
        let r = if t + 1 == n { reward } else { 0.0 };
        let v = values[t] as f64;
        let delta = r + gamma * next_value - v;
        next_adv = delta + gamma * lam * next_adv;
        adv[t] = next_adv;
        next_value = v;
    }
    let returns = adv.iter().zip(values).map(|(a, &v)| a + v as f64).collect();
    (adv, returns)
}

/// Per-token advantages (whitened over all responses' tokens together when the settings
/// say so) and returns of a learner's responses.
pub fn token_advantages(rewards: &[f64], values: &[&[f32]], s: &CriticSettings) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let (mut adv, ret): (Vec<Vec<f64>>, Vec<Vec<f64>>) =
        rewards.iter().zip(values).map(|(&r, v)| gae(r, v, s.gamma, s.lam)).unzip();
    if s.whiten {
        let all: Vec<f64> = adv.iter().flatten().copied().collect();
        if all.len() > 1 {
            let n = all.len() as f64;
            let mean = all.iter().sum::<f64>() / n;
            // TRL's masked_whiten: the unbiased variance, shifted back to zero mean.
            let var = all.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
            let scale = 1.0 / (var + 1e-8).sqrt();
            for a in adv.iter_mut().flatten() {
                *a = (*a - mean) * scale;
            }
        }
    }
    let to_f32 = |v: Vec<Vec<f64>>| v.into_iter().map(|r| r.into_iter().map(|x| x as f32).collect()).collect();
    (to_f32(adv), to_f32(ret))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three tokens, reward 1 at the end, values 0.5, 0.2, 0.1, γ = 1, λ = 0.5, by hand:
    /// δ = (0 + 0.2 − 0.5, 0 + 0.1 − 0.2, 1 + 0 − 0.1) = (−0.3, −0.1, 0.9);
    /// A_3 = 0.9, A_2 = −0.1 + 0.5·0.9 = 0.35, A_1 = −0.3 + 0.5·0.35 = −0.125;
    /// returns = A + V = (0.375, 0.55, 1.0).
    #[test]
    fn gae_on_a_hand_computed_three_token_response() {
        let (a, r) = gae(1.0, &[0.5, 0.2, 0.1], 1.0, 0.5);
        for (got, want) in a.iter().zip([-0.125, 0.35, 0.9]) {
            assert!((got - want).abs() < 1e-6, "{a:?}");
        }
        for (got, want) in r.iter().zip([0.375, 0.55, 1.0]) {
            assert!((got - want).abs() < 1e-6, "{r:?}");
        }
        // λ = 1, γ = 1: every advantage is the reward minus the token's value.
        let (a, _) = gae(2.0, &[0.5, 0.25], 1.0, 1.0);
        assert_eq!(a, vec![1.5, 1.75]);
        // A discount shrinks what the reward is worth to earlier tokens.
        let (a, _) = gae(1.0, &[0.0, 0.0], 0.5, 1.0);
        assert_eq!(a, vec![0.5, 1.0]);
    }

    #[test]
    fn whitening_spans_every_response_of_the_learner() {
        let s = CriticSettings::default();
        let (a, r) = token_advantages(&[1.0, 0.0], &[&[0.0, 0.0], &[0.0]], &s);
        let all: Vec<f64> = a.iter().flatten().map(|&x| x as f64).collect();
        let mean = all.iter().sum::<f64>() / 3.0;
        let var = all.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 2.0;
        assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-4, "{a:?}");
        // Returns are not whitened.
        assert_eq!(r[0], vec![0.95, 1.0]);
        let off = CriticSettings { whiten: false, ..s };
        assert_eq!(token_advantages(&[1.0], &[&[0.0]], &off).0, vec![vec![1.0]]);
        assert!(CriticSettings { lam: 1.5, ..s }.validate().is_err());
    }
}
