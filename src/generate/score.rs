//! Per-token log-probabilities of given responses, computed in vocabulary-sized chunks.
//!
//! `log p(y_t | y_<t) = z[y_t]/T − logsumexp(z/T)` with `z = h Wᵀ`. Materialising `z` for a
//! whole batch is `[tokens, vocab]` floats: 32k tokens × 152k vocabulary = 20 GB. Both
//! versions here walk the rows in chunks of at most [`CHUNK_ELEMENTS`] logits:
//! - [`token_logprobs`] (any backend, no gradient) for rollouts and evaluation;
//! - [`token_logprobs_autodiff`] for training, a custom autodiff op whose backward recomputes
//!   each chunk's logits but the first instead of keeping them, so the graph holds only `h`,
//!   `W`, one log-sum-exp per token and at most one chunk of logits (the "fused linear
//!   cross-entropy" trick).

use burn::tensor::{DType, FloatDType, IndexingUpdateOp, ops::FloatTensor};
use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive, backend::Backend};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

use crate::backend::{bf16_matmul, bf16_panels, cast, f32_matmul, flex_fast, packed_weight};
use crate::dtype::{cast_to, f32_weight};

/// Upper bound on logits alive at once (64 MiB of f32).
pub const CHUNK_ELEMENTS: usize = 1 << 24;

fn chunk_rows(vocab: usize) -> usize {
    (CHUNK_ELEMENTS / vocab.max(1)).max(1)
}

fn targets_tensor<B: Backend>(targets: &[u32], device: &B::Device) -> Tensor<B, 1, Int> {
    let data: Vec<i64> = targets.iter().map(|&t| t as i64).collect();
    Tensor::from_data(TensorData::new(data, [targets.len()]), device)
}

/// The second operand of a pass's products, one per chunk of rows: packed once for all of them
/// where the CPU's panel products apply ([`packed_weight::PackedPanels`]: bf16 with
/// AVX512-BF16, f32 with AVX-512), or the model's own packed copy of it (a rollout copy's LM
/// head), else multiplied in its dtype by [`product_in`].
struct Operand<'a, B: Backend> {
    b: Tensor<B, 2>,
    packed: Option<packed_weight::PackedPanels>,
    kept: Option<&'a packed_weight::PackedWeight>,
}

impl<B: Backend> Operand<'_, B> {
    /// `b` for the products of `rows` rows in all: packed where they are enough to pay for it
    /// (decoding's few rows read it as stored faster than packing it), and, f32, where its
    /// chunks run on the panels (`f32_matmul::PackedF32::serves`: a 49k vocabulary's chunks of
    /// 341 rows do not).
    fn new(b: Tensor<B, 2>, rows: usize) -> Self {
        const PACKED_ROWS: usize = 64;
        // An LM head's larger side is its vocabulary.
        let chunk = rows.min(chunk_rows(b.dims()[0].max(b.dims()[1])));
        let served = b.dtype() != DType::F32 || f32_matmul::PackedF32::serves(chunk);
        let packed = (rows >= PACKED_ROWS && served).then(|| packed_weight::PackedPanels::of(&b)).flatten();
        Operand { packed, b, kept: None }
    }

    /// The LM head's: logits `rows · weightᵀ` multiplied in the weight's dtype (the model's
    /// compute dtype, see `CausalLm::lm_head_weight`), returned in f32: log-softmax runs in f32.
    fn head(weight: Tensor<B, 2>, rows: usize) -> Self {
        Self::new(weight.transpose(), rows)
    }

    /// `a · b` in `b`'s dtype, returned in f32.
    fn product(&self, a: Tensor<B, 2>) -> Tensor<B, 2> {
        let a = match self.kept.map(|kept| kept.product(a.clone(), &self.b)) {
            Some(Ok(y)) => return y,
            _ => a,
        };
        let a = match &self.packed {
            Some(packed) if a.dtype() == DType::F32 => match packed.product(a) {
                Ok(y) => return y,
                Err(a) => a,
            },
            _ => a,
        };
        product_in(FloatDType::from(self.b.dtype()), a, self.b.clone())
    }
}

impl<'a, B: Backend> Operand<'a, B> {
    /// `model`'s LM head for the products of `rows` rows: from the packed copy the model keeps
    /// where it keeps one, not packed again.
    fn head_of(model: &'a crate::model::CausalLm<B>, rows: usize) -> Self {
        match model.lm_head_packed.as_deref() {
            Some(kept) => Operand { b: model.lm_head_weight().transpose(), packed: None, kept: Some(kept) },
            None => Self::head(model.lm_head_weight(), rows),
        }
    }
}

/// `a · b` multiplied in `dtype`, returned in f32: through the CPU's own products where they
/// apply ([`f32_matmul::product`], [`bf16_matmul::matmul`]), else burn's ops on the casts.
fn product_in<B: Backend>(dtype: FloatDType, a: Tensor<B, 2>, b: Tensor<B, 2>) -> Tensor<B, 2> {
    if dtype == FloatDType::F32 {
        return f32_matmul::product(cast_to(a, dtype), cast_to(b, dtype));
    }
    match bf16_matmul::matmul(a, cast_to(b, dtype)) {
        Ok(p) => p,
        Err((a, b)) => f32_weight(cast_to(a, dtype).matmul(b)),
    }
}

/// Forward for one chunk, from its logits `z: [n, vocab]`: (log-prob of each target,
/// log-sum-exp of each row).
fn chunk_logprobs<B: Backend>(z: Tensor<B, 2>, targets: &[u32], inv_temperature: f32) -> (Tensor<B, 1>, Tensor<B, 1>) {
    let n = z.dims()[0];
    let device = z.device();
    if let Some((logp, lse)) = flex_fast::target_logprobs(&z, targets, inv_temperature) {
        let vec = |v: Vec<f32>| Tensor::from_data(TensorData::new(v, [n]), &device);
        return (vec(logp), vec(lse));
    }
    let z = z.mul_scalar(inv_temperature);
    // In two stages: a long row reduction loses its tail on wgpu (backend/reduce.rs).
    let lse = crate::backend::reduce::row_logsumexp(z.clone()); // [n, 1]
    let picked = z.gather(1, targets_tensor::<B>(targets, &device).reshape([n, 1])); // [n, 1]
    ((picked - lse.clone()).reshape([n]), lse.reshape([n]))
}

/// Gradient of `Σ g_i · logp_i` with respect to the chunk's logits `z` (before 1/T).
fn chunk_logits_grad<B: Backend>(
    z: Tensor<B, 2>,
    lse: Tensor<B, 1>,
    targets: &[u32],
    grad: Tensor<B, 1>,
    inv_temperature: f32,
) -> Tensor<B, 2> {
    match flex_fast::target_logprobs_grad(z, &lse, targets, &grad, inv_temperature) {
        Ok(dz) => dz,
        Err(z) => {
            let c = targets.len();
            let p = (z.mul_scalar(inv_temperature) - lse.reshape([c, 1])).exp();
            let g = grad.reshape([c, 1]);
            let t = targets_tensor::<B>(targets, &p.device()).reshape([c, 1]);
            (-p * g.clone()).scatter(1, t, g, IndexingUpdateOp::Add).mul_scalar(inv_temperature)
        }
    }
}

/// Log-probabilities `[n]` of `targets` given final hidden states `hidden: [n, hidden]` and
/// the LM head `weight: [vocab, hidden]`, at temperature `1 / inv_temperature`. No gradient.
pub fn token_logprobs<B: Backend>(
    hidden: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    targets: &[u32],
    inv_temperature: f32,
) -> Tensor<B, 1> {
    let n = hidden.dims()[0];
    logprobs_through(hidden, Operand::head(weight, n), targets, inv_temperature)
}

/// [`token_logprobs`] with the LM head as `head` (`[hidden, vocab]`).
fn logprobs_through<B: Backend>(
    hidden: Tensor<B, 2>,
    head: Operand<'_, B>,
    targets: &[u32],
    inv_temperature: f32,
) -> Tensor<B, 1> {
    let [n, d] = hidden.dims();
    assert_eq!(n, targets.len(), "one target per hidden row");
    let device = hidden.device();
    let rows = chunk_rows(head.b.dims()[1]);
    let mut parts = Vec::new();
    for start in (0..n).step_by(rows) {
        let end = (start + rows).min(n);
        let h = hidden.clone().slice([start..end, 0..d]);
        parts.push(chunk_logprobs(head.product(h), &targets[start..end], inv_temperature).0);
    }
    if parts.is_empty() {
        return Tensor::zeros([0], &device);
    }
    Tensor::cat(parts, 0)
}

#[derive(Debug)]
struct ChunkedLogProbs;

/// Saved for the backward pass.
#[derive(Clone, Debug)]
struct ChunkedState<B: Backend> {
    hidden: FloatTensor<B>,
    weight: FloatTensor<B>,
    targets: Vec<u32>,
    /// Per-row log-sum-exp of the logits over the temperature.
    lse: FloatTensor<B>,
    inv_temperature: f32,
    rows: usize,
    /// The first chunk's logits, kept from the forward pass rather than recomputed: the
    /// forward pass holds them beside the chunk it computes, the backward pass frees them
    /// before it computes another, so no more logits are alive than the memory plan's three
    /// chunks (`memory_plan`: logits, softmax, gradient). A batch that fits one chunk (a small
    /// vocabulary or few tokens) skips the recomputation altogether.
    first_logits: Option<FloatTensor<B>>,
}

impl<B: Backend> Backward<B, 2> for ChunkedLogProbs {
    type State = ChunkedState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_hidden, node_weight] = ops.parents;
        let grad_out: Tensor<B, 1> = Tensor::from_primitive(TensorPrimitive::Float(grads.consume::<B>(&ops.node)));
        let ChunkedState { hidden, weight, targets, lse, inv_temperature: inv_t, rows, mut first_logits } = ops.state;
        let hidden: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(hidden));
        let weight: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(weight));
        let lse: Tensor<B, 1> = Tensor::from_primitive(TensorPrimitive::Float(lse));

        let [n, d] = hidden.dims();
        // The products run in the weight's dtype; each gradient is returned in its input's.
        let (dtype, hidden_dtype) = (FloatDType::from(weight.dtype()), FloatDType::from(hidden.dtype()));
        let mut grad_hidden = Vec::new();
        let mut grad_weight: Option<Tensor<B, 2>> = None;
        let head = (n > rows || first_logits.is_none()).then(|| Operand::head(weight.clone(), n));
        // The inputs' gradient reads the weight along the vocabulary: a bf16 weight is packed or
        // laid out so once for every chunk (the CPU's bf16 product would transpose it per chunk).
        let down = node_hidden.is_some().then(|| match Operand::new(weight.clone(), n) {
            Operand { packed: None, b, .. } if dtype == FloatDType::BF16 => {
                Operand { b: bf16_matmul::for_decoding(b), packed: None, kept: None }
            }
            down => down,
        });
        for start in (0..n).step_by(rows) {
            let end = (start + rows).min(n);
            let h = hidden.clone().slice([start..end, 0..d]);
            let z = match first_logits.take() {
                Some(z) => Tensor::from_primitive(TensorPrimitive::Float(z)),
                None => head.as_ref().expect("made when a chunk is recomputed").product(h.clone()),
            };
            let dz = chunk_logits_grad(
                z,
                lse.clone().narrow(0, start, end - start),
                &targets[start..end],
                grad_out.clone().narrow(0, start, end - start),
                inv_t,
            );
            if let Some(down) = &down {
                grad_hidden.push(cast_to(down.product(dz.clone()), hidden_dtype));
            }
            if node_weight.is_some() {
                // Summed over chunks in f32.
                let gw = match (dtype == FloatDType::BF16).then(|| bf16_panels::transposed_product(&dz, &h)).flatten() {
                    Some(gw) => gw,
                    None => product_in(dtype, dz.transpose(), h),
                };
                grad_weight = Some(match grad_weight {
                    Some(acc) => acc + gw,
                    None => gw,
                });
            }
        }
        if let Some(node) = node_hidden {
            let gh = if grad_hidden.is_empty() { hidden.zeros_like() } else { Tensor::cat(grad_hidden, 0) };
            grads.register::<B>(node.id, gh.into_primitive().tensor());
        }
        if let Some(node) = node_weight {
            let gw = cast::cast(grad_weight.unwrap_or_else(|| weight.zeros_like()), dtype);
            grads.register::<B>(node.id, gw.into_primitive().tensor());
        }
    }
}

/// [`token_logprobs`] with gradients to `hidden` and `weight`, without keeping any
/// `[rows, vocab]` tensor in the autodiff graph.
pub fn token_logprobs_autodiff<B: Backend, C: CheckpointStrategy>(
    hidden: Tensor<Autodiff<B, C>, 2>,
    weight: Tensor<Autodiff<B, C>, 2>,
    targets: &[u32],
    inv_temperature: f32,
) -> Tensor<Autodiff<B, C>, 1> {
    let rows = chunk_rows(weight.dims()[0]);
    token_logprobs_autodiff_in_chunks(hidden, weight, targets, inv_temperature, rows, true)
}

fn token_logprobs_autodiff_in_chunks<B: Backend, C: CheckpointStrategy>(
    hidden: Tensor<Autodiff<B, C>, 2>,
    weight: Tensor<Autodiff<B, C>, 2>,
    targets: &[u32],
    inv_temperature: f32,
    rows: usize,
    keep_first_logits: bool,
) -> Tensor<Autodiff<B, C>, 1> {
    let n = hidden.dims()[0];
    assert_eq!(n, targets.len(), "one target per hidden row");
    let h = hidden.into_primitive().tensor();
    let w = weight.into_primitive().tensor();
    let h_inner: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(h.primitive.clone()));
    let w_inner: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(w.primitive.clone()));
    let device = h_inner.device();
    let d = h_inner.dims()[1];

    let mut logps = Vec::new();
    let mut lses = Vec::new();
    let mut first_logits = None;
    let head = Operand::head(w_inner.clone(), n);
    for start in (0..n).step_by(rows) {
        let end = (start + rows).min(n);
        let z = head.product(h_inner.clone().slice([start..end, 0..d]));
        if start == 0 && keep_first_logits {
            first_logits = Some(z.clone().into_primitive().tensor());
        }
        let (lp, lse) = chunk_logprobs(z, &targets[start..end], inv_temperature);
        logps.push(lp);
        lses.push(lse);
    }
    let (out, lse) = if logps.is_empty() {
        (Tensor::<B, 1>::zeros([0], &device), Tensor::<B, 1>::zeros([0], &device))
    } else {
        (Tensor::cat(logps, 0), Tensor::cat(lses, 0))
    };
    let out = out.into_primitive().tensor();

    let result = match ChunkedLogProbs.prepare::<C>([h.node.clone(), w.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(
            ChunkedState {
                hidden: h.primitive,
                weight: w.primitive,
                targets: targets.to_vec(),
                lse: lse.into_primitive().tensor(),
                inv_temperature,
                rows,
                first_logits,
            },
            out,
        ),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Tensor::from_primitive(TensorPrimitive::Float(result))
}

/// Final hidden states of the positions that predict each response token, flattened over
/// the batch: `([response tokens, hidden], targets, response lengths)`. The tokens are packed
/// without padding for the matmuls; the attention runs in passes of like lengths, right-padded,
/// which needs no mask (later slots never influence earlier ones); when responses share prompts
/// (a group's samples) or prompt beginnings, each shared prompt or prefix runs once
/// ([`super::shared_prompt`]).
pub fn response_hidden<B: Backend>(
    model: &crate::model::CausalLm<B>,
    requests: &[(Vec<u32>, Vec<u32>)],
) -> crate::error::Result<(Tensor<B, 2>, Vec<u32>, Vec<usize>)> {
    let batch = TokenBatch::of(&model.config, requests)?;
    let hidden = match requests.is_empty() {
        true => Tensor::zeros([0, model.config.hidden_size], &model.device()),
        false => super::shared_prompt::Passes::of(requests).response_hidden(model),
    };
    Ok((hidden, batch.targets, batch.lens))
}

/// [`response_hidden`] over the whole right-padded batch in one pass, every prompt run once
/// per response: the reference the planned passes are tested against.
#[cfg(test)]
pub(crate) fn dense_hidden<B: Backend>(
    model: &crate::model::CausalLm<B>,
    requests: &[(Vec<u32>, Vec<u32>)],
) -> Tensor<B, 2> {
    let device = model.device();
    let (b, t) = (requests.len(), requests.iter().map(|(p, r)| p.len() + r.len()).max().unwrap_or(1));
    let (mut ids, mut rows) = (vec![0i64; b * t], Vec::new());
    for (i, (p, r)) in requests.iter().enumerate() {
        for (j, &tok) in p.iter().chain(r).enumerate() {
            ids[i * t + j] = tok as i64;
        }
        rows.extend((0..r.len()).map(|j| (i * t + p.len() - 1 + j) as i64));
    }
    let layout = model.layout_tensors(&crate::model::Layout::dense(b, t));
    let hidden = model.forward_hidden(Tensor::from_data(TensorData::new(ids, [b, t]), &device), &layout, None);
    let d = hidden.dims()[2];
    let n = rows.len();
    hidden.reshape([b * t, d]).select(0, Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [n]), &device))
}

/// Prompt + response pairs checked against a model's context, with the tokens each predicts.
pub struct TokenBatch {
    /// Every response token, in request order.
    pub targets: Vec<u32>,
    /// Response lengths.
    pub lens: Vec<usize>,
}

impl TokenBatch {
    /// Checks every pair against the context of a model configured as `config`.
    pub fn of(config: &crate::model::ModelConfig, requests: &[(Vec<u32>, Vec<u32>)]) -> crate::error::Result<Self> {
        use crate::error::Error;
        let context = config.max_position_embeddings;
        for (p, r) in requests {
            if p.is_empty() {
                return Err(Error::InvalidArgument(
                    "cannot score a response without a prompt: the first response token needs a preceding token".into(),
                ));
            }
            if p.len() + r.len() > context {
                return Err(Error::PromptTooLong { prompt_tokens: p.len() + r.len(), context });
            }
        }
        Ok(TokenBatch {
            targets: requests.iter().flat_map(|(_, r)| r.iter().copied()).collect(),
            lens: requests.iter().map(|(_, r)| r.len()).collect(),
        })
    }
}

/// Log-probs of each response token given its prompt (no gradient), at `temperature`.
pub fn score<B: Backend>(
    model: &crate::model::CausalLm<B>,
    requests: &[(Vec<u32>, Vec<u32>)],
    temperature: f32,
) -> crate::error::Result<Vec<Vec<f32>>> {
    let (hidden, targets, lens) = response_hidden(model, requests)?;
    let head = Operand::head_of(model, targets.len());
    let flat = logprobs_through(hidden, head, &targets, 1.0 / temperature);
    split_rows(flat, &lens)
}

/// [`score`], plus a per-token reading `read` of the same hidden states (a value head's
/// values), from one forward pass.
pub fn score_and_read<B: Backend>(
    model: &crate::model::CausalLm<B>,
    requests: &[(Vec<u32>, Vec<u32>)],
    temperature: f32,
    read: &dyn Fn(Tensor<B, 2>) -> Tensor<B, 1>,
) -> crate::error::Result<(Rows, Rows)> {
    let (hidden, targets, lens) = response_hidden(model, requests)?;
    let readings = read(hidden.clone());
    let head = Operand::head_of(model, targets.len());
    let flat = logprobs_through(hidden, head, &targets, 1.0 / temperature);
    Ok((split_rows(flat, &lens)?, split_rows(readings, &lens)?))
}

/// A per-token reading `read` of `model`'s hidden states over the responses (a value model's
/// values), without the log-probs.
pub fn read_responses<B: Backend>(
    model: &crate::model::CausalLm<B>,
    requests: &[(Vec<u32>, Vec<u32>)],
    read: &dyn Fn(Tensor<B, 2>) -> Tensor<B, 1>,
) -> crate::error::Result<Rows> {
    let (hidden, _, lens) = response_hidden(model, requests)?;
    split_rows(read(hidden), &lens)
}

/// One row of per-token numbers per response.
pub type Rows = Vec<Vec<f32>>;

/// A flat per-token tensor as one row per response.
pub fn split_rows<B: Backend>(flat: Tensor<B, 1>, lens: &[usize]) -> crate::error::Result<Vec<Vec<f32>>> {
    let flat = flat.into_data().into_vec::<f32>().map_err(|e| crate::error::Error::Internal(format!("{e:?}")))?;
    let mut out = Vec::with_capacity(lens.len());
    let mut at = 0;
    for &l in lens {
        out.push(flat[at..at + l].to_vec());
        at += l;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Cpu, CpuAutodiff, flex_fast::without_fast_paths};
    use burn::tensor::Distribution;
    use burn::tensor::activation::log_softmax;

    type Ad = CpuAutodiff;

    /// (values, d/d hidden, d/d weight) of `Σ_i c_i · logp_i` for the chunked op, the weight
    /// cast to `dtype` in the graph (as `CausalLm::lm_head_weight` does), its gradient returned
    /// to the f32 weight.
    #[allow(clippy::too_many_arguments)]
    fn chunked(
        dtype: FloatDType,
        h: &Tensor<Cpu, 2>,
        w: &Tensor<Cpu, 2>,
        t: &[u32],
        c: &Tensor<Cpu, 1>,
        inv_t: f32,
        rows: usize,
        keep_first_logits: bool,
    ) -> [Vec<f32>; 3] {
        let h = Tensor::<Ad, 2>::from_inner(h.clone()).require_grad();
        let w = Tensor::<Ad, 2>::from_inner(w.clone()).require_grad();
        let head = cast::cast(w.clone(), dtype);
        let lp = token_logprobs_autodiff_in_chunks(h.clone(), head, t, inv_t, rows, keep_first_logits);
        let grads = (lp.clone() * Tensor::from_inner(c.clone())).sum().backward();
        let v = |x: Tensor<Cpu, 2>| x.into_data().into_vec::<f32>().unwrap();
        [lp.inner().into_data().into_vec().unwrap(), v(h.grad(&grads).unwrap()), v(w.grad(&grads).unwrap())]
    }

    /// The same through a full `[n, vocab]` log-softmax and burn's own autodiff.
    fn naive(h: &Tensor<Cpu, 2>, w: &Tensor<Cpu, 2>, t: &[u32], c: &Tensor<Cpu, 1>, inv_t: f32) -> [Vec<f32>; 3] {
        let n = t.len();
        let h = Tensor::<Ad, 2>::from_inner(h.clone()).require_grad();
        let w = Tensor::<Ad, 2>::from_inner(w.clone()).require_grad();
        let logp = log_softmax(h.clone().matmul(w.clone().transpose()).mul_scalar(inv_t), 1);
        let idx = Tensor::<Ad, 2, Int>::from_data(
            TensorData::new(t.iter().map(|&x| x as i64).collect::<Vec<_>>(), [n, 1]),
            &Default::default(),
        );
        let lp = logp.gather(1, idx).reshape([n]);
        let grads = (lp.clone() * Tensor::from_inner(c.clone())).sum().backward();
        let v = |x: Tensor<Cpu, 2>| x.into_data().into_vec::<f32>().unwrap();
        [lp.inner().into_data().into_vec().unwrap(), v(h.grad(&grads).unwrap()), v(w.grad(&grads).unwrap())]
    }

    /// Random hidden states `[n, d]`, an LM head `[vocab, d]`, per-token loss weights `[n]` and
    /// targets spread over the vocabulary.
    fn inputs(
        n: usize,
        d: usize,
        vocab: usize,
        step: u32,
    ) -> (Tensor<Cpu, 2>, Tensor<Cpu, 2>, Tensor<Cpu, 1>, Vec<u32>) {
        let dev = Default::default();
        let h = Tensor::<Cpu, 2>::random([n, d], Distribution::Normal(0.0, 1.0), &dev);
        let w = Tensor::<Cpu, 2>::random([vocab, d], Distribution::Normal(0.0, 0.5), &dev);
        let c = Tensor::<Cpu, 1>::random([n], Distribution::Normal(0.0, 1.0), &dev);
        let targets = (0..n as u32).map(|i| (i * step + 5) % vocab as u32).collect();
        (h, w, c, targets)
    }

    fn close(a: &[f32], b: &[f32], what: &str) {
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-3);
        let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(err / scale < 1e-4, "{what}: max error {err} (scale {scale})");
    }

    #[test]
    fn chunked_logprobs_match_full_log_softmax_values_and_gradients() {
        let (h, w, c, targets) = inputs(13, 16, 300, 37);
        for inv_t in [1.0, 1.0 / 0.7] {
            let want = naive(&h, &w, &targets, &c, inv_t);
            for (rows, keep) in [(4, false), (4, true), (13, true), (100, false)] {
                let fast = chunked(FloatDType::F32, &h, &w, &targets, &c, inv_t, rows, keep);
                let generic = without_fast_paths(|| chunked(FloatDType::F32, &h, &w, &targets, &c, inv_t, rows, keep));
                for (name, got) in [("flex fast path", &fast), ("generic ops", &generic)] {
                    let case = format!("{rows} rows/chunk, first logits kept: {keep}");
                    close(&got[0], &want[0], &format!("{name}: values, {case}"));
                    close(&got[1], &want[1], &format!("{name}: d hidden, {case}"));
                    close(&got[2], &want[2], &format!("{name}: d weight, {case}"));
                }
            }
        }
    }

    /// In bf16 the CPU packs the LM head once per pass for its chunks' products (forward,
    /// recomputed logits, both gradients): the same numbers as burn's ops on the bf16 casts up
    /// to the order of the sums, and the no-grad pass gives the autodiff one's values.
    #[test]
    fn bf16_chunks_give_burns_bf16_values_and_gradients() {
        // Rows enough to pack the head for, in chunks with a last partial one; a vocabulary of
        // several 48-column panels and a partial last one; an odd hidden size.
        let (h, w, c, targets) = inputs(70, 33, 500, 37);
        for (rows, keep) in [(16, false), (16, true), (70, true)] {
            let fast = chunked(FloatDType::BF16, &h, &w, &targets, &c, 1.0, rows, keep);
            let generic = without_fast_paths(|| chunked(FloatDType::BF16, &h, &w, &targets, &c, 1.0, rows, keep));
            for (i, what) in ["values", "d hidden", "d weight"].iter().enumerate() {
                let scale = generic[i].iter().fold(0f32, |m, x| m.max(x.abs()));
                let err = fast[i].iter().zip(&generic[i]).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                // bf16 keeps 8 bits: a few of its steps, relative to the largest value.
                assert!(err <= 2e-2 * scale, "{what}, {rows} rows/chunk, kept {keep}: max error {err} (scale {scale})");
            }
            // The weight as the rollout copy stores it (`precision::rollout_copy`).
            let scored = token_logprobs(h.clone(), cast::cast(w.clone(), FloatDType::BF16), &targets, 1.0);
            let scored: Vec<f32> = scored.into_data().into_vec().unwrap();
            let same = scored.iter().zip(&fast[0]).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{rows} rows/chunk: the no-grad pass differs from the autodiff one");
        }
    }

    #[test]
    fn no_grad_scoring_matches_the_autodiff_values() {
        let dev = Default::default();
        let h = Tensor::<Cpu, 2>::random([7, 8], Distribution::Normal(0.0, 1.0), &dev);
        let w = Tensor::<Cpu, 2>::random([50, 8], Distribution::Normal(0.0, 1.0), &dev);
        let targets = [1u32, 4, 9, 16, 25, 36, 49];
        let c = Tensor::<Cpu, 1>::ones([7], &dev);
        let a = token_logprobs(h.clone(), w.clone(), &targets, 1.0).into_data().into_vec::<f32>().unwrap();
        let b = without_fast_paths(|| token_logprobs(h.clone(), w.clone(), &targets, 1.0))
            .into_data()
            .into_vec::<f32>()
            .unwrap();
        close(&a, &chunked(FloatDType::F32, &h, &w, &targets, &c, 1.0, 3, true)[0], "no-grad vs autodiff");
        close(&a, &b, "fast vs generic");
    }

    /// Keeping the first chunk's logits from the forward pass changes no bit of the result:
    /// the backward pass would recompute the same product.
    #[test]
    fn kept_logits_give_the_recomputed_gradients_bit_for_bit() {
        // Enough multiply-adds that the CPU's product splits over its threads.
        let n = 96;
        let (h, w, c, targets) = inputs(n, 64, 2000, 611);
        for rows in [n, 40] {
            let kept = chunked(FloatDType::F32, &h, &w, &targets, &c, 1.0, rows, true);
            let recomputed = chunked(FloatDType::F32, &h, &w, &targets, &c, 1.0, rows, false);
            for (what, i) in [("values", 0), ("d hidden", 1), ("d weight", 2)] {
                let same = kept[i].iter().zip(&recomputed[i]).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{what}, {rows} rows/chunk: kept logits changed the result");
            }
        }
    }
}
