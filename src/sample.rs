//! The one record every workload produces: a sample (one response of one policy in one role),
//! with the opaque key of the group its advantage is normalised in, as verl's `uid`.

use serde::{Deserialize, Serialize};

use crate::generate::FinishReason;
use crate::tokenizer::Message;

/// The group a sample's advantage is computed in. Opaque to the trainer and the algorithms:
/// only equality matters (a task id and role for the HACPO exchange; a turn or a fork as well
/// for multi-turn workloads).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GroupKey(pub String);

impl GroupKey {
    /// A key from its parts (joined with `|`).
    pub fn new(parts: &[&str]) -> Self {
        GroupKey(parts.join("|"))
    }
}

/// A generated response as a sample stores it (`workload::response`: without the terminal
/// EOS, text decoded without special tokens).
#[derive(Clone, Debug)]
pub struct Response {
    pub ids: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
}

/// One sample of a step (also what crosses between the processes of a cluster run).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sample {
    /// Position in the step's sample list (assigned by the trainer after the rollout).
    pub id: usize,
    /// The policy that produced it.
    pub policy: usize,
    pub role: String,
    pub group: GroupKey,
    /// The sample whose output this one consumed (multi-stage workloads), if any.
    pub parent: Option<usize>,
    /// The turn of a multi-turn episode it was generated at (0 elsewhere).
    pub turn: u32,
    /// The step prompt it answers (index into the step's prompts).
    pub prompt: usize,
    /// Its position among the producing policy's samples of that prompt.
    pub sample_index: usize,
    pub messages: Vec<Message>,
    /// Response text without EOS and special tokens.
    pub text: String,
    /// The producing policy's prompt ids.
    pub prompt_ids: Vec<u32>,
    /// Its response ids without the terminal EOS (`[eos]` for an EOS-only response).
    pub response_ids: Vec<u32>,
    /// Its log-prob of each response id at step start (old policy), filled by the trainer.
    pub token_logps: Vec<f32>,
    /// The value head's estimate at each response token at step start (actor-critic
    /// algorithms; empty otherwise), filled by the trainer.
    pub values: Vec<f32>,
    /// Filled by the workload's reward stage.
    pub reward: Option<f64>,
    /// The workload's format penalty of this output (≤ 0; MHGPO's P_k), 0 where it has none.
    pub penalty: f64,
    /// The task score of a final output before any penalty (the search Answerer's F1).
    pub score: Option<f64>,
    /// Whether any policy learns from it (an upstream singleton is kept for the record only).
    pub train: bool,
    pub policy_version: u64,
    pub finish_reason: FinishReason,
    /// Which response tokens the policy wrote (true) and which the environment put between its
    /// turns (false: tool responses, the next turn's headers), which stay out of the loss;
    /// empty when every token is the policy's (a single-turn response).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loss_mask: Vec<bool>,
}

impl Sample {
    /// Policy `policy` (at weights version `version`)'s `response` to step prompt `prompt`, as
    /// the rollout produced it: the first output of the prompt in role `""`, in no group, with
    /// no parent, at turn 0, trained, and with no reward, penalty or score yet. A workload sets
    /// what it knows beside (`Sample { role, group, .. Sample::new(..) }`).
    pub fn new(
        policy: usize,
        version: u64,
        prompt: usize,
        messages: Vec<Message>,
        prompt_ids: Vec<u32>,
        response: Response,
    ) -> Sample {
        Sample {
            id: 0,
            policy,
            role: String::new(),
            group: GroupKey(String::new()),
            parent: None,
            turn: 0,
            prompt,
            sample_index: 0,
            messages,
            text: response.text,
            prompt_ids,
            response_ids: response.ids,
            token_logps: vec![],
            values: vec![],
            reward: None,
            penalty: 0.0,
            score: None,
            train: true,
            policy_version: version,
            finish_reason: response.finish_reason,
            loss_mask: vec![],
        }
    }

    /// Mean old log-prob per response token (GSPO's length normalisation).
    pub fn mean_logp(&self) -> f64 {
        mean_logp(&self.token_logps)
    }

    /// The reward, 0 until the reward stage has run.
    pub fn reward(&self) -> f64 {
        self.reward.unwrap_or(0.0)
    }
}

/// The mean of a response's per-token log-probs (0 for none): GSPO's length-normalised
/// sequence log-prob.
pub fn mean_logp(token_logps: &[f32]) -> f64 {
    let n = token_logps.len().max(1);
    token_logps.iter().map(|&x| x as f64).sum::<f64>() / n as f64
}
