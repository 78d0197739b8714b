//! Building a [`CausalLm`] from named host tensors and back.
//!
//! Every weight source (safetensors, sharded safetensors, GGUF, random init) yields tensors by
//! their Hugging Face name; [`build`] asks for each name the architecture needs, checks its
//! shape against the config and uploads it as f32. [`to_write`] walks the model the other
//! way for saving, each weight downloaded only when the file writer reaches it. Keeping names
//! and shapes in one place ([`expected_weights`]) means loading, saving and error messages can
//! never disagree about what a checkpoint must contain.

use std::borrow::Cow;

use burn::module::Param;
use burn::tensor::{Tensor, TensorData, backend::Backend};

use super::config::ModelConfig;
use super::lora::LoraAdapter;
use super::transformer::{Attention, CausalLm, DecoderLayer, Linear, Mlp, RmsNorm};
use crate::error::{Error, Result};

/// A weight in host memory, f32, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl HostTensor {
    /// `t`'s values downloaded, as f32, in its layout.
    pub fn of<B: Backend, const D: usize>(t: Tensor<B, D>) -> Self {
        let shape = t.dims().to_vec();
        HostTensor { shape, data: t.into_data().convert::<f32>().into_vec::<f32>().expect("f32 values") }
    }
}

/// A tensor of a file being written: its name and shape now, its values only when the writer
/// reaches it. A save then holds one tensor's bytes beside the model instead of a copy of all
/// of them (an 8B model's weights are 32 GB in f32, its AdamW moments 64 GB).
pub struct Pending<'a> {
    pub name: String,
    pub shape: Vec<usize>,
    values: Values<'a>,
}

enum Values<'a> {
    Borrowed(&'a [f32]),
    Owned(Vec<f32>),
    /// Produced when written (a download from the device), then dropped.
    Later(Box<dyn Fn() -> Vec<f32> + 'a>),
}

impl<'a> Pending<'a> {
    /// A tensor already in host memory, written from where it lies.
    pub fn borrowed(name: String, t: &'a HostTensor) -> Self {
        Pending { name, shape: t.shape.clone(), values: Values::Borrowed(&t.data) }
    }

    /// A tensor whose values `values` produces when the writer reaches it, once.
    pub fn later(name: String, shape: Vec<usize>, values: impl Fn() -> Vec<f32> + 'a) -> Self {
        Pending { name, shape, values: Values::Later(Box::new(values)) }
    }

    /// A tensor on its device, downloaded (as f32) when the writer reaches it.
    pub fn device<B: Backend, const D: usize>(name: String, t: Tensor<B, D>) -> Pending<'static> {
        let shape = t.dims().to_vec();
        Pending::later(name, shape, move || HostTensor::of(t.clone()).data)
    }

    /// Its values in host memory.
    pub fn values(&self) -> Cow<'_, [f32]> {
        match &self.values {
            Values::Borrowed(v) => Cow::Borrowed(v),
            Values::Owned(v) => Cow::Borrowed(v),
            Values::Later(f) => Cow::Owned(f()),
        }
    }

    /// Into a [`HostTensor`] (produced now if it was to be produced later).
    pub fn into_host(self) -> HostTensor {
        let data = match self.values {
            Values::Borrowed(v) => v.to_vec(),
            Values::Owned(v) => v,
            Values::Later(f) => f(),
        };
        HostTensor { shape: self.shape, data }
    }

    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

impl From<(String, HostTensor)> for Pending<'static> {
    fn from((name, t): (String, HostTensor)) -> Self {
        Pending { name, shape: t.shape, values: Values::Owned(t.data) }
    }
}

/// Anything that can hand out weights by HF name.
pub trait WeightSource {
    /// Human-readable origin used in error messages (a file or directory).
    fn describe(&self) -> String;
    /// Takes the tensor `name` (its declared shape and its data as f32), or `None` if absent.
    fn take(&mut self, name: &str) -> Result<Option<HostTensor>>;
}

/// The names (within `model.layers.N.`) and shapes of one decoder layer's weights.
fn layer_weights(c: &ModelConfig) -> Vec<(&'static str, Vec<usize>)> {
    let (d, h, kv, hd, f) =
        (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size);
    let mut w = vec![
        ("input_layernorm.weight", vec![d]),
        ("self_attn.q_proj.weight", vec![h * hd, d]),
        ("self_attn.k_proj.weight", vec![kv * hd, d]),
        ("self_attn.v_proj.weight", vec![kv * hd, d]),
        ("self_attn.o_proj.weight", vec![d, h * hd]),
    ];
    if c.qkv_bias {
        w.push(("self_attn.q_proj.bias", vec![h * hd]));
        w.push(("self_attn.k_proj.bias", vec![kv * hd]));
        w.push(("self_attn.v_proj.bias", vec![kv * hd]));
    }
    if c.o_bias {
        w.push(("self_attn.o_proj.bias", vec![d]));
    }
    if c.qk_norm {
        w.push(("self_attn.q_norm.weight", vec![hd]));
        w.push(("self_attn.k_norm.weight", vec![hd]));
    }
    w.push(("post_attention_layernorm.weight", vec![d]));
    w.push(("mlp.gate_proj.weight", vec![f, d]));
    w.push(("mlp.up_proj.weight", vec![f, d]));
    w.push(("mlp.down_proj.weight", vec![d, f]));
    if c.mlp_bias {
        w.push(("mlp.gate_proj.bias", vec![f]));
        w.push(("mlp.up_proj.bias", vec![f]));
        w.push(("mlp.down_proj.bias", vec![d]));
    }
    w
}

/// The names and shapes of all weights of `config`, in checkpoint order.
pub fn expected_weights(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let d = c.hidden_size;
    let layer = layer_weights(c);
    let mut w = vec![("model.embed_tokens.weight".to_string(), vec![c.vocab_size, d])];
    for i in 0..c.num_hidden_layers {
        w.extend(layer.iter().map(|(name, shape)| (format!("model.layers.{i}.{name}"), shape.clone())));
    }
    w.push(("model.norm.weight".to_string(), vec![d]));
    if !c.tie_word_embeddings {
        w.push(("lm_head.weight".to_string(), vec![c.vocab_size, d]));
    }
    w
}

/// How many weights `config` has (without listing them).
fn weight_count(c: &ModelConfig) -> usize {
    2 + c.num_hidden_layers * layer_weights(c).len() + usize::from(!c.tie_word_embeddings)
}

/// Builds the model from `source`, checking every shape.
pub fn build<B: Backend>(
    config: &ModelConfig,
    source: &mut dyn WeightSource,
    device: &B::Device,
) -> Result<CausalLm<B>> {
    let progress = crate::progress::Progress::new("loading weights", weight_count(config) as u64);
    let mut loader = Loader { source, device, config, progress: &progress };
    let mut layers = Vec::new();
    for i in 0..config.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let linear = |l: &mut Loader<'_, B>, name: &str, bias: bool| -> Result<Linear<B>> {
            Ok(Linear {
                weight: l.linear_weight(&format!("{p}.{name}.weight"))?,
                bias: if bias { Some(l.param1(&format!("{p}.{name}.bias"))?) } else { None },
                lora: None,
                packed: None,
            })
        };
        let self_attn = Attention {
            q_proj: linear(&mut loader, "self_attn.q_proj", config.qkv_bias)?,
            k_proj: linear(&mut loader, "self_attn.k_proj", config.qkv_bias)?,
            v_proj: linear(&mut loader, "self_attn.v_proj", config.qkv_bias)?,
            o_proj: linear(&mut loader, "self_attn.o_proj", config.o_bias)?,
            q_norm: if config.qk_norm { Some(loader.norm(&format!("{p}.self_attn.q_norm.weight"))?) } else { None },
            k_norm: if config.qk_norm { Some(loader.norm(&format!("{p}.self_attn.k_norm.weight"))?) } else { None },
            num_heads: config.num_attention_heads,
            num_kv_heads: config.num_key_value_heads,
            head_dim: config.head_dim,
        };
        let mlp = Mlp {
            gate_proj: linear(&mut loader, "mlp.gate_proj", config.mlp_bias)?,
            up_proj: linear(&mut loader, "mlp.up_proj", config.mlp_bias)?,
            down_proj: linear(&mut loader, "mlp.down_proj", config.mlp_bias)?,
        };
        layers.push(DecoderLayer {
            input_layernorm: loader.norm(&format!("{p}.input_layernorm.weight"))?,
            self_attn,
            post_attention_layernorm: loader.norm(&format!("{p}.post_attention_layernorm.weight"))?,
            mlp,
        });
    }
    let embed_tokens = loader.param2("model.embed_tokens.weight")?;
    let norm = loader.norm("model.norm.weight")?;
    let lm_head = if config.tie_word_embeddings { None } else { Some(loader.param2("lm_head.weight")?) };
    progress.finish();
    let compute = Default::default();
    Ok(CausalLm { embed_tokens, layers, norm, lm_head, lm_head_packed: None, config: config.clone(), compute })
}

struct Loader<'a, B: Backend> {
    source: &'a mut dyn WeightSource,
    device: &'a B::Device,
    config: &'a ModelConfig,
    progress: &'a crate::progress::Progress,
}

impl<B: Backend> Loader<'_, B> {
    fn host(&mut self, name: &str) -> Result<HostTensor> {
        let expected = expected_shape(self.config, name);
        let t = self
            .source
            .take(name)?
            .ok_or_else(|| Error::MissingWeight { name: name.into(), file: self.source.describe() })?;
        if t.shape != expected {
            return Err(Error::WeightShape {
                name: name.into(),
                file: self.source.describe(),
                expected,
                found: t.shape,
            });
        }
        // A NaN or inf weight would show up much later as `null` log-probs or a "diverged"
        // training run; name it here instead.
        if let Some(bad) = t.data.iter().find(|x| !x.is_finite()) {
            return Err(Error::WeightFile {
                path: self.source.describe().into(),
                message: format!(
                    "weight {name} holds a non-finite value ({bad}); the checkpoint is damaged or was saved from a diverged run"
                ),
            });
        }
        self.progress.inc(1);
        Ok(t)
    }

    fn param2(&mut self, name: &str) -> Result<Param<Tensor<B, 2>>> {
        let t = self.host(name)?;
        let shape = [t.shape[0], t.shape[1]];
        Ok(Param::from_tensor(Tensor::from_data(TensorData::new(t.data, shape), self.device)))
    }

    /// A linear weight: HF `[out, in]` on disk, `[in, out]` in the model (see `Linear`).
    fn linear_weight(&mut self, name: &str) -> Result<Param<Tensor<B, 2>>> {
        let t = self.host(name)?;
        let (out, inp) = (t.shape[0], t.shape[1]);
        let data = transposed(&t.data, out, inp);
        Ok(Param::from_tensor(Tensor::from_data(TensorData::new(data, [inp, out]), self.device)))
    }

    fn param1(&mut self, name: &str) -> Result<Param<Tensor<B, 1>>> {
        let t = self.host(name)?;
        let shape = [t.shape[0]];
        Ok(Param::from_tensor(Tensor::from_data(TensorData::new(t.data, shape), self.device)))
    }

    fn norm(&mut self, name: &str) -> Result<RmsNorm<B>> {
        Ok(RmsNorm { weight: self.param1(name)?, eps: self.config.rms_norm_eps })
    }
}

/// The transpose of a row-major `[rows, cols]` matrix, on the host (so that the device tensor
/// is contiguous and the matmuls read it as fast as any other).
pub(crate) fn transposed(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; data.len()];
    for (i, row) in data.chunks_exact(cols).enumerate() {
        for (j, &x) in row.iter().enumerate() {
            out[j * rows + i] = x;
        }
    }
    out
}

/// The shape `config` implies for the weight `name` (empty for a name it has no weight of).
fn expected_shape(config: &ModelConfig, name: &str) -> Vec<usize> {
    let d = config.hidden_size;
    match name {
        "model.embed_tokens.weight" => return vec![config.vocab_size, d],
        "model.norm.weight" => return vec![d],
        "lm_head.weight" if !config.tie_word_embeddings => return vec![config.vocab_size, d],
        _ => {}
    }
    let Some((layer, field)) = name.strip_prefix("model.layers.").and_then(|rest| rest.split_once('.')) else {
        return vec![];
    };
    if !layer.parse::<usize>().is_ok_and(|i| i < config.num_hidden_layers) {
        return vec![];
    }
    layer_weights(config).into_iter().find(|(n, _)| *n == field).map(|(_, s)| s).unwrap_or_default()
}

/// Visits (and may replace) every parameter of a model, by its HF name.
pub trait ParamVisitor<B: Backend> {
    fn vector(&mut self, name: &str, p: Param<Tensor<B, 1>>) -> Param<Tensor<B, 1>>;
    /// `stored_transposed`: linear weights are kept as `[in, out]`, the transpose of the
    /// `[out, in]` tensor the name refers to in a checkpoint.
    fn matrix(&mut self, name: &str, p: Param<Tensor<B, 2>>, stored_transposed: bool) -> Param<Tensor<B, 2>>;
}

/// Passes every parameter of `model` through `v`, in checkpoint order, and reassembles the
/// model. The single traversal that export, optimizers and gradient clipping share, so they
/// agree on names by construction.
pub fn walk_params<B: Backend, V: ParamVisitor<B>>(model: CausalLm<B>, v: &mut V) -> CausalLm<B> {
    // A packed copy serves the weights it was packed from, which the visitor may replace.
    let CausalLm { embed_tokens, layers, norm, lm_head, config, compute, lm_head_packed: _ } = model;
    let embed_tokens = v.matrix("model.embed_tokens.weight", embed_tokens, false);
    // Adapters are visited under PEFT's module names (`…q_proj.lora_A.weight`), stored
    // transposed like the weight they adapt.
    let linear = |v: &mut V, p: &str, l: Linear<B>| Linear {
        weight: v.matrix(&format!("{p}.weight"), l.weight, true),
        bias: l.bias.map(|b| v.vector(&format!("{p}.bias"), b)),
        lora: l.lora.map(|a| LoraAdapter {
            a: v.matrix(&format!("{p}.lora_A.weight"), a.a, true),
            b: v.matrix(&format!("{p}.lora_B.weight"), a.b, true),
            scale: a.scale,
        }),
        packed: None,
    };
    let norm_of = |v: &mut V, name: String, n: RmsNorm<B>| RmsNorm { weight: v.vector(&name, n.weight), eps: n.eps };
    let layers = layers
        .into_iter()
        .enumerate()
        .map(|(i, layer)| {
            let p = format!("model.layers.{i}");
            let DecoderLayer { input_layernorm, self_attn, post_attention_layernorm, mlp } = layer;
            let input_layernorm = norm_of(v, format!("{p}.input_layernorm.weight"), input_layernorm);
            let a = self_attn;
            let self_attn = Attention {
                q_proj: linear(v, &format!("{p}.self_attn.q_proj"), a.q_proj),
                k_proj: linear(v, &format!("{p}.self_attn.k_proj"), a.k_proj),
                v_proj: linear(v, &format!("{p}.self_attn.v_proj"), a.v_proj),
                o_proj: linear(v, &format!("{p}.self_attn.o_proj"), a.o_proj),
                q_norm: a.q_norm.map(|n| norm_of(v, format!("{p}.self_attn.q_norm.weight"), n)),
                k_norm: a.k_norm.map(|n| norm_of(v, format!("{p}.self_attn.k_norm.weight"), n)),
                num_heads: a.num_heads,
                num_kv_heads: a.num_kv_heads,
                head_dim: a.head_dim,
            };
            let post_attention_layernorm =
                norm_of(v, format!("{p}.post_attention_layernorm.weight"), post_attention_layernorm);
            let mlp = Mlp {
                gate_proj: linear(v, &format!("{p}.mlp.gate_proj"), mlp.gate_proj),
                up_proj: linear(v, &format!("{p}.mlp.up_proj"), mlp.up_proj),
                down_proj: linear(v, &format!("{p}.mlp.down_proj"), mlp.down_proj),
            };
            DecoderLayer { input_layernorm, self_attn, post_attention_layernorm, mlp }
        })
        .collect();
    let norm = norm_of(v, "model.norm.weight".into(), norm);
    let lm_head = lm_head.map(|w| v.matrix("lm_head.weight", w, false));
    CausalLm { embed_tokens, layers, norm, lm_head, lm_head_packed: None, config, compute }
}

/// Rebuilds `model` with every projection passed through `f(name, module, linear)`, where
/// `name` is the HF prefix (`model.layers.3.self_attn.q_proj`) and `module` its last part.
pub fn map_linears<B: Backend>(
    model: CausalLm<B>,
    mut f: impl FnMut(&str, &str, Linear<B>) -> Result<Linear<B>>,
) -> Result<CausalLm<B>> {
    let mut layers = Vec::with_capacity(model.layers.len());
    for (i, mut layer) in model.layers.into_iter().enumerate() {
        let p = format!("model.layers.{i}");
        let a = &mut layer.self_attn;
        for (module, l) in
            [("q_proj", &mut a.q_proj), ("k_proj", &mut a.k_proj), ("v_proj", &mut a.v_proj), ("o_proj", &mut a.o_proj)]
        {
            *l = f(&format!("{p}.self_attn.{module}"), module, l.clone())?;
        }
        let m = &mut layer.mlp;
        for (module, l) in
            [("gate_proj", &mut m.gate_proj), ("up_proj", &mut m.up_proj), ("down_proj", &mut m.down_proj)]
        {
            *l = f(&format!("{p}.mlp.{module}"), module, l.clone())?;
        }
        layers.push(layer);
    }
    Ok(CausalLm { layers, ..model })
}

/// Every projection of `model` with its HF prefix, in checkpoint order (read-only
/// [`map_linears`]).
pub fn linears<B: Backend>(model: &CausalLm<B>) -> impl Iterator<Item = (String, &Linear<B>)> {
    model.layers.iter().enumerate().flat_map(|(i, l)| {
        let (a, m) = (&l.self_attn, &l.mlp);
        let attn = [("q_proj", &a.q_proj), ("k_proj", &a.k_proj), ("v_proj", &a.v_proj), ("o_proj", &a.o_proj)]
            .map(|(module, l)| (format!("model.layers.{i}.self_attn.{module}"), l));
        let mlp = [("gate_proj", &m.gate_proj), ("up_proj", &m.up_proj), ("down_proj", &m.down_proj)]
            .map(|(module, l)| (format!("model.layers.{i}.mlp.{module}"), l));
        attn.into_iter().chain(mlp)
    })
}

/// All weights of `model` by HF name and in HF layout, in checkpoint order, each downloaded
/// only when written. Adapters are folded in first, on the device (an HF directory has no
/// place for them; training checkpoints keep them apart: [`super::lora::save_adapter`]).
pub fn to_write<B: Backend>(model: &CausalLm<B>) -> Vec<Pending<'static>> {
    struct Collect(Vec<Pending<'static>>);
    impl<B: Backend> ParamVisitor<B> for Collect {
        fn vector(&mut self, name: &str, p: Param<Tensor<B, 1>>) -> Param<Tensor<B, 1>> {
            self.0.push(Pending::device(name.to_string(), p.val()));
            p
        }
        fn matrix(&mut self, name: &str, p: Param<Tensor<B, 2>>, stored_transposed: bool) -> Param<Tensor<B, 2>> {
            let t = if stored_transposed { p.val().transpose() } else { p.val() };
            self.0.push(Pending::device(name.to_string(), t));
            p
        }
    }
    let mut c = Collect(Vec::new());
    walk_params(super::lora::merge(model.clone()), &mut c);
    c.0
}

/// [`to_write`], downloaded now.
pub fn export<B: Backend>(model: &CausalLm<B>) -> Vec<(String, HostTensor)> {
    to_write(model).into_iter().map(|p| (p.name.clone(), p.into_host())).collect()
}

/// `model`'s structure with a one-element tensor (one shared zero) for every parameter: what a
/// field holds while the model's weights are being replaced by an update. Not a model to run.
pub fn stand_in<B: Backend>(model: &CausalLm<B>) -> CausalLm<B> {
    struct StandIn<B: Backend>(Tensor<B, 1>, Tensor<B, 2>);
    impl<B: Backend> ParamVisitor<B> for StandIn<B> {
        fn vector(&mut self, _: &str, p: Param<Tensor<B, 1>>) -> Param<Tensor<B, 1>> {
            p.map(|_| self.0.clone())
        }
        fn matrix(&mut self, _: &str, p: Param<Tensor<B, 2>>, _: bool) -> Param<Tensor<B, 2>> {
            p.map(|_| self.1.clone())
        }
    }
    let device = model.embed_tokens.val().device();
    walk_params(model.clone(), &mut StandIn(Tensor::zeros([1], &device), Tensor::zeros([1, 1], &device)))
}

/// Random weights like transformers' `_init_weights`: normal(0, `std`) matrices, zero biases,
/// unit norms. For benchmarks and tests that need a model of a given shape.
pub struct RandomWeights {
    config: ModelConfig,
    rng: rand_chacha::ChaCha8Rng,
    std: f32,
    /// `Some(seed)`: each matrix drawn from streams of its own, in parallel ([`Self::parallel`]).
    parallel_seed: Option<u64>,
}

/// Values a parallel draw takes from one ChaCha stream.
const STREAM_VALUES: usize = 1 << 20;

impl RandomWeights {
    pub fn new(config: &ModelConfig, seed: u64, std: f32) -> Self {
        use rand::SeedableRng;
        let rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        RandomWeights { config: config.clone(), rng, std, parallel_seed: None }
    }

    /// The same distribution drawn on every core: a matrix's values come from its name and
    /// `seed`, one ChaCha stream per million values. For benchmarks of large shapes, where one
    /// thread takes 25 s over a 1.5B model; a different draw from [`Self::new`]'s, which
    /// pre-training and tests keep.
    pub fn parallel(config: &ModelConfig, seed: u64, std: f32) -> Self {
        RandomWeights { parallel_seed: Some(seed), ..Self::new(config, seed, std) }
    }
}

impl WeightSource for RandomWeights {
    fn describe(&self) -> String {
        "random initialisation".into()
    }

    fn take(&mut self, name: &str) -> Result<Option<HostTensor>> {
        use rand::SeedableRng;
        use rand_distr::{Distribution, Normal};
        use rayon::prelude::*;
        let shape = expected_shape(&self.config, name);
        let n: usize = shape.iter().product();
        let normal = Normal::new(0.0f32, self.std).expect("valid std");
        let data = if name.ends_with("norm.weight") {
            vec![1.0; n]
        } else if name.ends_with(".bias") {
            vec![0.0; n]
        } else if let Some(seed) = self.parallel_seed {
            let seed = seed ^ crate::stable_hash::hash_bytes(name.as_bytes());
            let mut data = vec![0.0; n];
            data.par_chunks_mut(STREAM_VALUES).enumerate().for_each(|(stream, chunk)| {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(stream as u64);
                chunk.iter_mut().for_each(|x| *x = normal.sample(&mut rng));
            });
            data
        } else {
            (0..n).map(|_| normal.sample(&mut self.rng)).collect()
        };
        Ok(Some(HostTensor { shape, data }))
    }
}

/// A three-layer Qwen3-shaped model (vocabulary 96, hidden 32) with random weights drawn
/// from `seed`, for tests of gradients and training mechanics.
#[cfg(test)]
pub fn small_random_model<B: Backend>(tied: bool, seed: u64) -> CausalLm<B> {
    small_model(tied, false, seed)
}

/// [`small_random_model`] (untied) with biased projections (q, k, v as Qwen2's, and o), the
/// biases non-zero (a checkpoint's would be; random initialisation leaves them at zero).
#[cfg(test)]
pub fn small_biased_model<B: Backend>(seed: u64) -> CausalLm<B> {
    struct Biases(f32);
    impl<B: Backend> ParamVisitor<B> for Biases {
        fn vector(&mut self, name: &str, p: Param<Tensor<B, 1>>) -> Param<Tensor<B, 1>> {
            if !name.ends_with(".bias") {
                return p;
            }
            let phase = self.0;
            self.0 += 1.0;
            p.map(|t| {
                let n = t.dims()[0];
                let values: Vec<f32> = (0..n).map(|i| 0.5 * (i as f32 * 0.73 + phase).sin()).collect();
                let biased = Tensor::from_data(TensorData::new(values, [n]), &t.device());
                if t.is_require_grad() { biased.require_grad() } else { biased }
            })
        }
        fn matrix(&mut self, _: &str, p: Param<Tensor<B, 2>>, _: bool) -> Param<Tensor<B, 2>> {
            p
        }
    }
    walk_params(small_model(false, true, seed), &mut Biases(seed as f32))
}

#[cfg(test)]
fn small_model<B: Backend>(tied: bool, biased: bool, seed: u64) -> CausalLm<B> {
    let v = serde_json::json!({
        "model_type": "qwen3", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 64,
        "tie_word_embeddings": tied, "attention_bias": biased
    });
    let config = ModelConfig::from_json(&v, "test").expect("a valid test config");
    build(&config, &mut RandomWeights::new(&config, seed, 0.3), &Default::default()).expect("random weights")
}

/// A loss of hidden states `[n, hidden]` through `model`'s LM head that weighs every row
/// differently (`−Σ_i (1 + i/4) · Σ_{j<7} log softmax(logits_i)_j`), so that gradient tests
/// notice rows that are dropped, repeated or swapped.
#[cfg(test)]
pub fn weighted_head_loss<B: Backend>(model: &CausalLm<B>, hidden: Tensor<B, 2>) -> Tensor<B, 1> {
    let n = hidden.dims()[0];
    let w: Vec<f32> = (0..n).map(|i| 1.0 + i as f32 * 0.25).collect();
    let w = Tensor::<B, 1>::from_data(TensorData::new(w, [n]), &hidden.device()).reshape([n, 1]);
    (burn::tensor::activation::log_softmax(model.logits(hidden), 1) * w).slice([0..n, 0..7]).sum().neg()
}

/// Converts raw little-endian bytes of a floating-point dtype to f32.
pub fn bytes_to_f32(bytes: &[u8], dtype: safetensors::Dtype) -> std::result::Result<Vec<f32>, String> {
    use safetensors::Dtype;
    let chunks = |w: usize| bytes.chunks_exact(w);
    Ok(match dtype {
        Dtype::F32 => chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::BF16 => chunks(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::F16 => chunks(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::F64 => chunks(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32).collect(),
        other => return Err(format!("dtype {other:?} is not a floating-point weight type")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(seed: u64, name: &str) -> Vec<f32> {
        let config = crate::bench::tiny_5m_config();
        RandomWeights::parallel(&config, seed, 0.02).take(name).unwrap().unwrap().data
    }

    /// The parallel draw depends on the seed and the matrix's name, not on the threads that
    /// drew it; its streams differ from one another; and it is normal(0, std).
    #[test]
    fn parallel_random_weights_repeat_on_any_threads_and_have_the_asked_spread() {
        let embed = "model.embed_tokens.weight";
        let a = draw(0, embed);
        assert_eq!(a.len(), 8192 * 256);
        let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        assert_eq!(a, one_thread.install(|| draw(0, embed)));
        assert_ne!(a, draw(1, embed));
        assert_ne!(a[..1000], a[STREAM_VALUES..STREAM_VALUES + 1000]);
        assert_ne!(a[..1000], draw(0, "model.layers.0.self_attn.q_proj.weight")[..1000]);
        let n = a.len() as f64;
        let mean = a.iter().map(|&x| x as f64).sum::<f64>() / n;
        let std = (a.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(mean.abs() < 1e-4 && (std - 0.02).abs() < 2e-4, "mean {mean}, std {std}");
        assert_eq!(draw(0, "model.norm.weight"), vec![1.0; 256]);
    }
}
