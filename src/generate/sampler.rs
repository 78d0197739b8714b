//! Choosing the next token from one row of logits: greedy, or temperature → top-k → top-p
//! (the order transformers' logits warpers apply them), with the log-probability of the
//! choice under the distribution it was drawn from.
//!
//! Each sequence owns a ChaCha8 stream keyed by `(seed, sequence index)`, so a sample depends
//! only on the seed and its own history: not on batch size, on which sequences finished
//! first, or on thread scheduling.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::math::fast_exp;

/// How to pick tokens.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 disables.
    pub top_k: usize,
    pub max_new_tokens: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 1.0, top_p: 1.0, top_k: 0, max_new_tokens: 256, seed: 0 }
    }
}

impl SamplingParams {
    pub fn greedy(max_new_tokens: usize) -> Self {
        SamplingParams { temperature: 0.0, max_new_tokens, ..Default::default() }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Rejects values that would make sampling meaningless.
    pub fn validate(&self) -> crate::error::Result<()> {
        use crate::error::Error;
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(Error::InvalidArgument(format!("temperature must be ≥ 0, got {}", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::InvalidArgument(format!("top-p must be in (0, 1], got {}", self.top_p)));
        }
        if self.max_new_tokens == 0 || self.max_new_tokens > super::MAX_TOKENS {
            return Err(Error::InvalidArgument(format!(
                "max-new-tokens must be between 1 and {}, got {}",
                super::MAX_TOKENS,
                self.max_new_tokens
            )));
        }
        Ok(())
    }
}

/// The random stream of sequence `index`.
pub fn sequence_rng(seed: u64, index: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(index);
    rng
}

/// Picks a token from `logits` (one row, raw model output). Returns the token and its
/// log-probability under the distribution it was drawn from; for greedy decoding that is the
/// model's distribution at temperature 1 (the greedy "distribution" is a point mass).
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut ChaCha8Rng) -> (u32, f32) {
    if params.is_greedy() {
        let (best, _) = argmax(logits);
        return (best as u32, log_softmax_at(logits, best, 1.0));
    }
    let inv_t = 1.0 / params.temperature;
    let vocab = logits.len();
    if (params.top_k == 0 || params.top_k >= vocab) && params.top_p >= 1.0 {
        // Every token a candidate: the same numbers as below, without a list of
        // (token, scaled logit) pairs the size of the vocabulary.
        let probs = softmax_of(logits.iter().map(|&z| z * inv_t), vocab);
        let chosen = draw(&probs, rng);
        return (chosen as u32, probs[chosen].ln());
    }
    // Candidates after top-k, as (token, scaled logit).
    let cand: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &z)| (i as u32, z * inv_t)).collect();
    sample_candidates(cand, params, rng)
}

/// [`sample`] from `cand` (token, scaled logit): top-k, then top-p, then a draw.
fn sample_candidates(mut cand: Vec<(u32, f32)>, params: &SamplingParams, rng: &mut ChaCha8Rng) -> (u32, f32) {
    if params.top_k > 0 && params.top_k < cand.len() {
        cand.select_nth_unstable_by(params.top_k - 1, |a, b| b.1.total_cmp(&a.1));
        cand.truncate(params.top_k);
    }
    let mut probs = softmax_of(cand.iter().map(|c| c.1), cand.len());

    if params.top_p < 1.0 {
        // Keep the most likely tokens until their mass reaches top_p (the token crossing it
        // included), like transformers' TopPLogitsWarper.
        let mut order: Vec<usize> = (0..cand.len()).collect();
        order.sort_unstable_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(cand[a].0.cmp(&cand[b].0)));
        let mut mass = 0.0;
        let mut keep = 0;
        for &i in &order {
            mass += probs[i];
            keep += 1;
            if mass >= params.top_p {
                break;
            }
        }
        let kept: Vec<usize> = order[..keep].to_vec();
        cand = kept.iter().map(|&i| cand[i]).collect();
        probs = kept.iter().map(|&i| probs[i]).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
    }
    let chosen = draw(&probs, rng);
    (cand[chosen].0, probs[chosen].ln())
}

/// The probabilities of `n` scaled logits: exponentials from the largest, summed in order.
fn softmax_of(scaled: impl Iterator<Item = f32> + Clone, n: usize) -> Vec<f32> {
    let max = scaled.clone().fold(f32::NEG_INFINITY, f32::max);
    let mut probs = Vec::with_capacity(n);
    probs.extend(scaled.map(|z| fast_exp(z - max)));
    let total: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    probs
}

/// The index where the running sum of `probs` first passes a uniform draw (the last one if
/// rounding leaves the sum short of it).
fn draw(probs: &[f32], rng: &mut ChaCha8Rng) -> usize {
    let u: f32 = rng.random();
    let mut acc = 0.0;
    for (i, &p) in probs.iter().enumerate() {
        acc += p;
        if u < acc {
            return i;
        }
    }
    probs.len() - 1
}

/// Index and value of the largest logit; the first one on ties, like `torch.argmax`.
pub fn argmax(logits: &[f32]) -> (usize, f32) {
    let mut best = 0;
    for (i, &z) in logits.iter().enumerate() {
        if z > logits[best] {
            best = i;
        }
    }
    (best, logits[best])
}

/// `log softmax(logits · inv_t)[index]`.
pub fn log_softmax_at(logits: &[f32], index: usize, inv_t: f32) -> f32 {
    logits[index] * inv_t - crate::backend::kernels::scaled_logsumexp(logits, inv_t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_first_maximum() {
        let (t, lp) = sample(&[0.0, 2.0, 2.0], &SamplingParams::greedy(1), &mut sequence_rng(0, 0));
        assert_eq!(t, 1);
        let want = 2.0 - (1.0f32 + 2.0 * 2f32.exp()).ln();
        assert!((lp - want).abs() < 1e-6);
    }

    #[test]
    fn top_k_one_is_greedy_with_zero_logprob() {
        let p = SamplingParams { temperature: 0.7, top_k: 1, ..Default::default() };
        for s in 0..20 {
            let (t, lp) = sample(&[0.1, 3.0, -1.0, 2.9], &p, &mut sequence_rng(s, 0));
            assert_eq!((t, lp), (1, 0.0));
        }
    }

    #[test]
    fn top_p_keeps_the_nucleus_only() {
        // probs ≈ [0.665, 0.245, 0.090]: top_p 0.7 keeps tokens 0 and 1.
        let p = SamplingParams { top_p: 0.7, ..Default::default() };
        let logits = [2.0, 1.0, 0.0];
        let mut seen = [0usize; 3];
        let mut rng = sequence_rng(3, 0);
        for _ in 0..2000 {
            let (t, lp) = sample(&logits, &p, &mut rng);
            seen[t as usize] += 1;
            let renorm =
                if t == 0 { 2f32.exp() / (2f32.exp() + 1f32.exp()) } else { 1f32.exp() / (2f32.exp() + 1f32.exp()) };
            assert!((lp - renorm.ln()).abs() < 1e-5);
        }
        assert_eq!(seen[2], 0);
        assert!(seen[0] > 1300 && seen[1] > 400, "{seen:?}");
    }

    #[test]
    fn temperature_sampling_matches_the_distribution() {
        let p = SamplingParams { temperature: 2.0, ..Default::default() };
        let logits = [0.0, 2.0f32.ln() * 2.0]; // at T=2: probs 1/3, 2/3
        let mut rng = sequence_rng(11, 5);
        let ones = (0..6000).filter(|_| sample(&logits, &p, &mut rng).0 == 1).count();
        assert!((3800..4200).contains(&ones), "{ones}");
    }

    /// Without top-k or top-p every token is a candidate, drawn without the candidates' list:
    /// the same token and log-probability, to the bit, as through it.
    #[test]
    fn sampling_the_whole_vocabulary_draws_what_the_candidates_path_draws() {
        let logits: Vec<f32> = (0..5000).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.013).collect();
        for (seed, temperature) in [(0, 1.0), (1, 0.6), (2, 1.7)] {
            let p = SamplingParams { temperature, ..Default::default() };
            let (mut a, mut b) = (sequence_rng(seed, 3), sequence_rng(seed, 3));
            for _ in 0..50 {
                let cand = logits.iter().enumerate().map(|(i, &z)| (i as u32, z * (1.0 / temperature))).collect();
                let (x, y) = (sample(&logits, &p, &mut a), sample_candidates(cand, &p, &mut b));
                assert_eq!((x.0, x.1.to_bits()), (y.0, y.1.to_bits()));
            }
        }
    }

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<f32> = (0..4).map(|_| sequence_rng(7, 1).random()).collect();
        let b: f32 = sequence_rng(7, 2).random();
        assert!(a.iter().all(|&x| x == a[0]));
        assert_ne!(a[0], b);
    }
}
