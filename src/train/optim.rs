//! AdamW exactly as PyTorch's `torch.optim.AdamW`, global-norm gradient clipping, and the
//! learning-rate schedule.
//!
//! Why not burn's optimizer: its state is keyed by `ParamId`, which is regenerated every time
//! a model is rebuilt from a checkpoint, so a resumed run would silently restart Adam's
//! moments; and its clipping is per tensor. Here state is keyed by the parameter's HF name
//! (the same [`walk_params`] traversal as saving), saved next to the weights, and clipping
//! uses the global norm over all gradients like `clip_grad_norm_`.

// BTreeMap, not HashMap: sums over parameters (the global norm) must run in the same order in
// every process, or a resumed run drifts from an uninterrupted one in the last bits.
use std::collections::BTreeMap;
use std::path::Path;

use burn::module::Param;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::loss_scale::LossScaler;
use crate::backend::kernels::AdamWStep;
use crate::error::{Error, Result};
use crate::model::CausalLm;
use crate::model::safetensors_io::{SafetensorsSource, SaveDtype, write_safetensors_file};
use crate::model::weights::{HostTensor, ParamVisitor, Pending, WeightSource, stand_in, walk_params};

/// AdamW settings with PyTorch's defaults spelled out (burn's differ: eps 1e-5, wd 1e-4).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdamWConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig { lr: 1e-6, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 }
    }
}

/// The shape of the learning-rate schedule after warm-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleKind {
    Constant,
    Cosine,
}

/// The learning-rate schedule over optimizer updates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LrSchedule {
    pub kind: ScheduleKind,
    /// Linear warm-up over this many updates.
    pub warmup_updates: u64,
    /// Cosine decays to `min_ratio · lr`.
    pub min_ratio: f64,
}

impl Default for LrSchedule {
    fn default() -> Self {
        LrSchedule { kind: ScheduleKind::Constant, warmup_updates: 0, min_ratio: 0.0 }
    }
}

impl LrSchedule {
    /// The learning rate of update `update` (0-based) out of `total`.
    pub fn lr(&self, base: f64, update: u64, total: u64) -> f64 {
        if update < self.warmup_updates {
            return base * (update + 1) as f64 / self.warmup_updates as f64;
        }
        match self.kind {
            ScheduleKind::Cosine => {
                let span = total.saturating_sub(self.warmup_updates).max(1) as f64;
                let progress = ((update - self.warmup_updates) as f64 / span).min(1.0);
                let min = base * self.min_ratio;
                min + 0.5 * (base - min) * (1.0 + (std::f64::consts::PI * progress).cos())
            }
            ScheduleKind::Constant => base,
        }
    }
}

/// A gradient (inner backend) of one parameter.
#[derive(Clone, Debug)]
pub enum Grad<B: Backend> {
    Vector(Tensor<B, 1>),
    Matrix(Tensor<B, 2>),
    /// In host memory (an offloaded policy's, `[[agents]] offload`), in the tensor's layout.
    Host(HostTensor),
}

/// Elements per task of the host's element-wise work on offloaded gradients.
const HOST_CHUNK: usize = 1 << 16;

/// What [`HostTensor::of`] took, back on `device`.
fn upload<B: Backend, const D: usize>(h: HostTensor, device: &B::Device) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(h.data, h.shape), device)
}

impl<B: Backend> Grad<B> {
    fn add(self, other: Grad<B>) -> Grad<B> {
        match (self, other) {
            (Grad::Vector(a), Grad::Vector(b)) => Grad::Vector(a + b),
            (Grad::Matrix(a), Grad::Matrix(b)) => Grad::Matrix(a + b),
            // The same f32 additions, element by element, as the device's; on every core, as an
            // 8B model's gradients are 32 GB a micro-batch.
            (Grad::Host(mut a), Grad::Host(b)) => {
                let chunks = a.data.par_chunks_mut(HOST_CHUNK).zip(b.data.par_chunks(HOST_CHUNK));
                chunks.for_each(|(x, y)| x.iter_mut().zip(y).for_each(|(x, y)| *x += y));
                Grad::Host(a)
            }
            _ => unreachable!("a parameter keeps its rank and its place"),
        }
    }

    fn scale(self, s: f64) -> Grad<B> {
        match self {
            Grad::Vector(a) => Grad::Vector(a.mul_scalar(s)),
            Grad::Matrix(a) => Grad::Matrix(a.mul_scalar(s)),
            // `mul_scalar` rounds the factor to f32 and multiplies in f32, as here.
            Grad::Host(mut a) => {
                let s = s as f32;
                a.data.par_chunks_mut(HOST_CHUNK).for_each(|x| x.iter_mut().for_each(|x| *x *= s));
                Grad::Host(a)
            }
        }
    }

    fn into_host(self) -> Grad<B> {
        match self {
            Grad::Vector(a) => Grad::Host(HostTensor::of(a)),
            Grad::Matrix(a) => Grad::Host(HostTensor::of(a)),
            host => host,
        }
    }

    /// On `device` (a host gradient is copied there).
    fn on_device(self, device: &B::Device) -> Grad<B> {
        match self {
            Grad::Host(h) if h.shape.len() == 1 => Grad::Vector(upload(h, device)),
            Grad::Host(h) => Grad::Matrix(upload(h, device)),
            resident => resident,
        }
    }

    /// Sum of squares, the same to the last bit in every run: rows are reduced on the device
    /// (one thread per row) and the row sums added on the host in order. A whole-tensor `sum`
    /// on the CPU backend splits large tensors across threads in a timing-dependent order.
    /// A host gradient is reduced on `device`, so it gives the same bits as a resident one.
    fn squared_norm(&self, device: Option<&B::Device>) -> f64 {
        let resident = match (self, device) {
            (Grad::Host(_), Some(device)) => self.clone().on_device(device),
            (Grad::Host(_), None) => unreachable!("a store that holds host gradients knows its device"),
            _ => self.clone(),
        };
        let rows = match resident {
            Grad::Vector(a) => crate::backend::reduce::row_sum(a.powi_scalar(2).unsqueeze::<2>()),
            Grad::Matrix(a) => crate::backend::reduce::row_sum(a.powi_scalar(2)),
            Grad::Host(_) => unreachable!("moved to the device above"),
        };
        let rows: Vec<f64> = rows.into_data().convert::<f64>().into_vec::<f64>().expect("f64 data");
        rows.iter().sum()
    }
}

/// Gradients accumulated over micro-batches, by parameter name.
#[derive(Debug)]
pub struct GradStore<B: Backend> {
    grads: BTreeMap<String, Grad<B>>,
    /// Set for an offloaded policy: each backward pass's gradients are added up in host memory,
    /// so the device holds only the pass's own; its norm is still taken on this device.
    offloaded: Option<B::Device>,
}

impl<B: Backend> Default for GradStore<B> {
    fn default() -> Self {
        GradStore { grads: BTreeMap::new(), offloaded: None }
    }
}

impl<B: Backend> GradStore<B> {
    /// A store that keeps the gradients in host memory (`[[agents]] offload`); `device` is the
    /// policy's.
    pub fn offloaded(device: B::Device) -> Self {
        GradStore { grads: BTreeMap::new(), offloaded: Some(device) }
    }

    /// Adds the gradients of `model`'s parameters from one backward pass.
    pub fn accumulate<AB: AutodiffBackend<InnerBackend = B>>(&mut self, model: &CausalLm<AB>, grads: &AB::Gradients) {
        struct Take<'a, AB: AutodiffBackend> {
            grads: &'a AB::Gradients,
            store: &'a mut BTreeMap<String, Grad<AB::InnerBackend>>,
            host: bool,
        }
        impl<AB: AutodiffBackend> Take<'_, AB> {
            fn add(&mut self, name: &str, g: Grad<AB::InnerBackend>) {
                add_into(self.store, name, if self.host { g.into_host() } else { g });
            }
        }
        impl<AB: AutodiffBackend> ParamVisitor<AB> for Take<'_, AB> {
            fn vector(&mut self, name: &str, p: Param<Tensor<AB, 1>>) -> Param<Tensor<AB, 1>> {
                if let Some(g) = p.val().grad(self.grads) {
                    self.add(name, Grad::Vector(g));
                }
                p
            }
            fn matrix(&mut self, name: &str, p: Param<Tensor<AB, 2>>, _: bool) -> Param<Tensor<AB, 2>> {
                if let Some(g) = p.val().grad(self.grads) {
                    self.add(name, Grad::Matrix(g));
                }
                p
            }
        }
        let host = self.offloaded.is_some();
        walk_params(model.clone(), &mut Take::<AB> { grads, store: &mut self.grads, host });
    }

    /// Global L2 norm of all gradients.
    pub fn global_norm(&self) -> f64 {
        self.grads.values().map(|g| g.squared_norm(self.offloaded.as_ref())).sum::<f64>().sqrt()
    }

    /// Every gradient divided by `scale` (the loss scaler's factor).
    pub fn unscale(&mut self, scale: f64) {
        for g in self.grads.values_mut() {
            *g = g.clone().scale(1.0 / scale);
        }
    }

    /// `clip_grad_norm_(max_norm)`: scales all gradients by `max_norm / (norm + 1e-6)` when
    /// that is below 1. Returns the norm before clipping.
    pub fn clip_global_norm(&mut self, max_norm: f64) -> f64 {
        let norm = self.global_norm();
        let coef = max_norm / (norm + 1e-6);
        if max_norm > 0.0 && coef < 1.0 {
            for g in self.grads.values_mut() {
                *g = g.clone().scale(coef);
            }
        }
        norm
    }

    /// The gradient of parameter `name` on the host, flattened (for tests and audits).
    pub fn host(&self, name: &str) -> Option<Vec<f32>> {
        let data = match self.grads.get(name)? {
            Grad::Vector(a) => a.to_data(),
            Grad::Matrix(a) => a.to_data(),
            Grad::Host(h) => return Some(h.data.clone()),
        };
        Some(data.convert::<f32>().into_vec::<f32>().expect("f32 gradient"))
    }

    /// The names of the parameters that have a gradient.
    pub fn names(&self) -> Vec<String> {
        self.grads.keys().cloned().collect()
    }

    /// The largest difference between this store's gradient of a parameter and `other`'s,
    /// relative to the largest entry of this one's, over every parameter (for tests: two ways
    /// of computing the same gradients). Both must hold the same parameters.
    #[cfg(test)]
    pub fn max_relative_diff(&self, other: &Self) -> f64 {
        assert_eq!(self.names(), other.names(), "the same parameters have gradients");
        let diff = |n: &String| {
            let (x, y) = (self.host(n).unwrap(), other.host(n).unwrap());
            let scale = x.iter().map(|v| v.abs() as f64).fold(1e-12, f64::max);
            x.iter().zip(&y).map(|(p, q)| (p - q).abs() as f64).fold(0.0, f64::max) / scale
        };
        self.names().iter().map(diff).fold(0.0, f64::max)
    }

    pub fn is_empty(&self) -> bool {
        self.grads.is_empty()
    }
}

fn add_into<B: Backend>(store: &mut BTreeMap<String, Grad<B>>, name: &str, g: Grad<B>) {
    let merged = match store.remove(name) {
        Some(prev) => prev.add(g),
        None => g,
    };
    store.insert(name.to_string(), merged);
}

/// Adam's moments of one parameter.
#[derive(Clone, Debug)]
enum Moments<B: Backend> {
    Vector(Tensor<B, 1>, Tensor<B, 1>),
    Matrix(Tensor<B, 2>, Tensor<B, 2>),
    /// In host memory (`[[agents]] offload`), in the tensor's layout.
    Host(HostTensor, HostTensor),
}

impl<B: Backend> Moments<B> {
    fn into_host(self) -> Moments<B> {
        match self {
            Moments::Vector(m, v) => Moments::Host(HostTensor::of(m), HostTensor::of(v)),
            Moments::Matrix(m, v) => Moments::Host(HostTensor::of(m), HostTensor::of(v)),
            host => host,
        }
    }

    /// On `device` (host moments are copied there, by their rank).
    fn on_device(self, device: &B::Device) -> Moments<B> {
        match self {
            Moments::Host(m, v) if m.shape.len() == 1 => Moments::Vector(upload(m, device), upload(v, device)),
            Moments::Host(m, v) => Moments::Matrix(upload(m, device), upload(v, device)),
            resident => resident,
        }
    }

    /// In host memory with `offload`, else on `device`.
    fn placed(self, offload: bool, device: &B::Device) -> Moments<B> {
        if offload { self.into_host() } else { self.on_device(device) }
    }
}

/// PyTorch AdamW with state by parameter name.
#[derive(Debug)]
pub struct AdamW<B: Backend> {
    pub config: AdamWConfig,
    /// Updates done so far (bias correction uses it).
    pub updates: u64,
    state: BTreeMap<String, Moments<B>>,
    /// The loss scaler of f16 compute ([`super::loss_scale`]), saved with the moments.
    pub scaler: Option<LossScaler>,
    /// The moments (and the gradients, [`AdamW::grad_store`]) wait in host memory, each
    /// parameter's copied to its device for its own update (`[[agents]] offload`). Where they
    /// are is not saved: a checkpoint is the same either way.
    offload: bool,
}

#[derive(Serialize, Deserialize)]
struct OptimMeta {
    updates: u64,
    config: AdamWConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    loss_scale: Option<LossScaler>,
}

impl<B: Backend> AdamW<B> {
    pub fn new(config: AdamWConfig) -> Self {
        AdamW { config, updates: 0, state: BTreeMap::new(), scaler: None, offload: false }
    }

    /// Moves the moments to host memory (`true`) or keeps them on the device.
    pub fn set_offload(&mut self, offload: bool, device: &B::Device) {
        self.offload = offload;
        for moments in self.state.values_mut() {
            *moments = moments.clone().placed(offload, device);
        }
    }

    /// An empty store for the gradients of an update: in host memory when the optimizer's
    /// state is offloaded.
    pub fn grad_store(&self, device: &B::Device) -> GradStore<B> {
        match self.offload {
            true => GradStore::offloaded(device.clone()),
            false => GradStore::default(),
        }
    }

    /// [`AdamW::step`] on the model `model` holds. Each old weight is dropped as its new one is
    /// made: `model` holds a stand-in meanwhile, not every old weight to the end of the update
    /// (an 8B model's are 32 GB beside the new ones). Should the update panic, `model` is left
    /// holding the stand-in: the caller must not run or save it then.
    pub fn update<AB: AutodiffBackend<InnerBackend = B>>(
        &mut self,
        model: &mut CausalLm<AB>,
        grads: GradStore<B>,
        lr: f64,
    ) {
        let old = std::mem::replace(model, stand_in(model));
        *model = self.step(old, grads, lr);
    }

    /// One update of `model` with `grads` at learning rate `lr`.
    pub fn step<AB: AutodiffBackend<InnerBackend = B>>(
        &mut self,
        model: CausalLm<AB>,
        grads: GradStore<B>,
        lr: f64,
    ) -> CausalLm<AB> {
        self.updates += 1;
        let t = self.updates as i32;
        let c = &self.config;
        let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        // Each constant in f32, as the tensor ops and the fused CPU update both use it.
        let step = AdamWStep {
            decay: (1.0 - lr * c.weight_decay) as f32,
            beta1: c.beta1 as f32,
            one_minus_beta1: (1.0 - c.beta1) as f32,
            beta2: c.beta2 as f32,
            one_minus_beta2: (1.0 - c.beta2) as f32,
            sqrt_bc2: bc2.sqrt() as f32,
            eps: c.eps as f32,
            step: (lr / bc1) as f32,
        };

        struct Update<'a, B: Backend> {
            grads: BTreeMap<String, Grad<B>>,
            state: &'a mut BTreeMap<String, Moments<B>>,
            step: AdamWStep,
            offload: bool,
        }
        impl<B: Backend> Update<'_, B> {
            fn apply<const D: usize>(
                &self,
                p: Tensor<B, D>,
                g: Tensor<B, D>,
                m: Tensor<B, D>,
                v: Tensor<B, D>,
            ) -> [Tensor<B, D>; 3] {
                let c = self.step;
                let [p, g, m, v] = match crate::backend::fused::adamw(p, g, m, v, c) {
                    Ok(updated) => return updated,
                    Err(inputs) => inputs,
                };
                // Decoupled weight decay first, as torch.optim.AdamW does.
                let p = p.mul_scalar(c.decay);
                let m = m.mul_scalar(c.beta1) + g.clone().mul_scalar(c.one_minus_beta1);
                let v = v.mul_scalar(c.beta2) + (g.clone() * g).mul_scalar(c.one_minus_beta2);
                let denom = v.clone().sqrt().div_scalar(c.sqrt_bc2).add_scalar(c.eps);
                let p = p - (m.clone() / denom).mul_scalar(c.step);
                [p, m, v]
            }
        }
        // Offloaded gradients and moments come to the parameter's device for its update alone.
        impl<AB: AutodiffBackend> ParamVisitor<AB> for Update<'_, AB::InnerBackend> {
            fn vector(&mut self, name: &str, p: Param<Tensor<AB, 1>>) -> Param<Tensor<AB, 1>> {
                let Some(g) = self.grads.remove(name) else { return p };
                p.map(|t| {
                    let (device, t) = (t.device(), t.inner());
                    let Grad::Vector(g) = g.on_device(&device) else { unreachable!("a parameter keeps its rank") };
                    let (m, v) = match self.state.remove(name).map(|m| m.on_device(&device)) {
                        Some(Moments::Vector(m, v)) => (m, v),
                        _ => (g.zeros_like(), g.zeros_like()),
                    };
                    let [np, m, v] = self.apply(t, g, m, v);
                    self.state.insert(name.to_string(), Moments::Vector(m, v).placed(self.offload, &device));
                    Tensor::from_inner(np).require_grad()
                })
            }
            fn matrix(&mut self, name: &str, p: Param<Tensor<AB, 2>>, _: bool) -> Param<Tensor<AB, 2>> {
                let Some(g) = self.grads.remove(name) else { return p };
                p.map(|t| {
                    let (device, t) = (t.device(), t.inner());
                    let Grad::Matrix(g) = g.on_device(&device) else { unreachable!("a parameter keeps its rank") };
                    let (m, v) = match self.state.remove(name).map(|m| m.on_device(&device)) {
                        Some(Moments::Matrix(m, v)) => (m, v),
                        _ => (g.zeros_like(), g.zeros_like()),
                    };
                    let [np, m, v] = self.apply(t, g, m, v);
                    self.state.insert(name.to_string(), Moments::Matrix(m, v).placed(self.offload, &device));
                    Tensor::from_inner(np).require_grad()
                })
            }
        }
        let mut u = Update { grads: grads.grads, state: &mut self.state, step, offload: self.offload };
        // The new parameters are leaves of graphs of their own until joined.
        super::autodiff_graph::join(walk_params(model, &mut u))
    }

    /// Writes the moments (`exp_avg.<name>`, `exp_avg_sq.<name>`, in the model's internal
    /// layout) and the update count to `path` (safetensors, written atomically).
    pub fn save(&self, path: &Path) -> Result<()> {
        // Each moment is written from where it lies (downloaded when the writer reaches it),
        // never all copied at once: an 8B model's are 64 GB.
        let mut tensors = Vec::new();
        for (name, moments) in &self.state {
            let (m, v) = (format!("exp_avg.{name}"), format!("exp_avg_sq.{name}"));
            match moments {
                Moments::Vector(a, b) => tensors.extend([Pending::device(m, a.clone()), Pending::device(v, b.clone())]),
                Moments::Matrix(a, b) => tensors.extend([Pending::device(m, a.clone()), Pending::device(v, b.clone())]),
                Moments::Host(a, b) => tensors.extend([Pending::borrowed(m, a), Pending::borrowed(v, b)]),
            }
        }
        write_safetensors_file(path, tensors, SaveDtype::F32)?;
        let meta = OptimMeta { updates: self.updates, config: self.config.clone(), loss_scale: self.scaler };
        let meta = serde_json::to_string(&meta).expect("json");
        crate::error::write_atomic(&path.with_extension("json"), meta.as_bytes())
    }

    /// Restores what [`AdamW::save`] wrote, the moments on `device` or, with `offload`, left
    /// in host memory (an offloaded 8B model's would not fit beside its weights).
    pub fn load(path: &Path, device: &B::Device, offload: bool) -> Result<Self> {
        let meta_path = path.with_extension("json");
        let meta: OptimMeta = serde_json::from_str(&crate::error::read_to_string(&meta_path)?)
            .map_err(|e| Error::config(meta_path.display().to_string(), e.to_string()))?;
        let mut src = SafetensorsSource::open_file(path)?;
        let mut state = BTreeMap::new();
        for key in src.names() {
            let Some(name) = key.strip_prefix("exp_avg.") else { continue };
            let m = src.take(&key)?.expect("listed tensor");
            let v = src.take(&format!("exp_avg_sq.{name}"))?.ok_or_else(|| Error::WeightFile {
                path: path.to_path_buf(),
                message: format!("exp_avg_sq.{name} is missing"),
            })?;
            // A damaged file is said to be one (resume then falls back to an older checkpoint),
            // rather than training on NaN moments or panicking on a shape.
            let damaged = |why: &str| Error::WeightFile {
                path: path.to_path_buf(),
                message: format!("the optimizer state of {name} {why}; the checkpoint is damaged"),
            };
            if m.shape != v.shape || !(1..=2).contains(&m.shape.len()) {
                return Err(damaged(&format!("has shapes {:?} and {:?}", m.shape, v.shape)));
            }
            if m.data.iter().any(|x| !x.is_finite()) || v.data.iter().any(|x| !(x.is_finite() && *x >= 0.0)) {
                return Err(damaged("holds non-finite or negative values"));
            }
            state.insert(name.to_string(), Moments::Host(m, v).placed(offload, device));
        }
        Ok(AdamW { config: meta.config, updates: meta.updates, state, scaler: meta.loss_scale, offload })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Cpu, CpuAutodiff, flex_fast::without_fast_paths};
    use crate::model::weights::{RandomWeights, build};

    /// Two AdamW updates of a small model from one backward pass: the CPU's fused update and
    /// the tensor ops agree, and one weight follows PyTorch's formula computed in f64.
    #[test]
    fn adamw_is_torch_adamw_with_and_without_the_fused_update() {
        let config = crate::bench::tiny_5m_config();
        let dev = Default::default();
        let model: CausalLm<CpuAutodiff> = build(&config, &mut RandomWeights::new(&config, 1, 0.02), &dev).unwrap();
        let requests = vec![(vec![1u32, 2, 3], vec![4u32, 5, 6, 7])];
        let (hidden, targets, _) = crate::generate::score::response_hidden(&model, &requests).unwrap();
        let logp = crate::generate::score::token_logprobs_autodiff(hidden, model.lm_head_weight(), &targets, 1.0);
        let mut store = GradStore::<Cpu>::default();
        store.accumulate(&model, &logp.mean().neg().backward());
        let name = "model.layers.0.mlp.down_proj.weight";
        let g = store.host(name).unwrap();
        let host = |m: &CausalLm<CpuAutodiff>| {
            let w = m.layers[0].mlp.down_proj.weight.val().transpose(); // HF's [out, in]
            w.into_data().into_vec::<f32>().unwrap()
        };
        let p0 = host(&model);
        let cfg = AdamWConfig { lr: 1e-3, weight_decay: 0.1, ..AdamWConfig::default() };
        let run = |fast: bool| {
            let go = || {
                let mut opt = AdamW::<Cpu>::new(cfg.clone());
                let regrads = |s: &GradStore<Cpu>| GradStore { grads: s.grads.clone(), offloaded: None };
                let m1 = opt.step(model.clone(), regrads(&store), cfg.lr);
                host(&opt.step(m1, regrads(&store), cfg.lr))
            };
            if fast { go() } else { without_fast_paths(go) }
        };
        let (fused, tensor_ops) = (run(true), run(false));
        // The weight's gradient in HF's layout, as `host` reads the weight.
        let [rows, cols] = [config.hidden_size, config.intermediate_size];
        let g_hf = |i: usize| g[(i % cols) * rows + i / cols] as f64;
        for i in (0..p0.len()).step_by(997) {
            let (b1, b2, eps, lr, wd) = (0.9f64, 0.999f64, 1e-8f64, 1e-3f64, 0.1f64);
            let (mut p, mut m, mut v) = (p0[i] as f64, 0.0, 0.0);
            for t in 1..=2 {
                p *= 1.0 - lr * wd;
                m = b1 * m + (1.0 - b1) * g_hf(i);
                v = b2 * v + (1.0 - b2) * g_hf(i) * g_hf(i);
                let denom = (v / (1.0 - b2.powi(t))).sqrt() + eps;
                p -= lr * (m / (1.0 - b1.powi(t))) / denom;
            }
            assert!((fused[i] as f64 - p).abs() < 1e-6, "fused {i}: {} vs {p}", fused[i]);
            assert!((tensor_ops[i] as f64 - p).abs() < 1e-6, "tensor ops {i}: {} vs {p}", tensor_ops[i]);
            assert!((fused[i] - tensor_ops[i]).abs() <= 1e-7, "{i}: {} vs {}", fused[i], tensor_ops[i]);
        }
    }

    /// Offloading (gradients added up and moments kept in host memory) changes where the
    /// optimizer's numbers wait, not one bit of them: two updates, each from two backward
    /// passes, a loss-scale division and a clipping that bites, give the resident optimizer's
    /// norms, weights and saved moments; the saved state then loads either way.
    #[test]
    fn offloaded_gradients_and_moments_give_the_resident_update_bit_for_bit() {
        use crate::generate::score::response_hidden;
        use crate::model::weights::{export, small_random_model, weighted_head_loss};
        let dev = Default::default();
        let model = small_random_model::<CpuAutodiff>(false, 7);
        let micro = [vec![(vec![1u32, 2, 3], vec![4u32, 5, 6])], vec![(vec![7u32, 8], vec![9u32, 10, 11, 12])]];
        let dir = tempfile::tempdir().unwrap();
        let run = |offload: bool| {
            let mut opt = AdamW::<Cpu>::new(AdamWConfig { lr: 1e-2, weight_decay: 0.1, ..AdamWConfig::default() });
            opt.set_offload(offload, &dev);
            let (mut m, mut norms) = (model.clone(), Vec::new());
            for _ in 0..2 {
                let mut store = opt.grad_store(&dev);
                for requests in &micro {
                    let (hidden, _, _) = response_hidden(&m, requests).unwrap();
                    store.accumulate(&m, &weighted_head_loss(&m, hidden).backward());
                }
                assert_eq!(store.grads.values().all(|g| matches!(g, Grad::Host(_))), offload);
                store.unscale(3.0);
                norms.push(store.clip_global_norm(0.5));
                m = opt.step(m, store, 1e-2);
            }
            assert_eq!(opt.state.values().all(|m| matches!(m, Moments::Host(..))), offload);
            let path = dir.path().join(format!("optimizer-{offload}.safetensors"));
            opt.save(&path).unwrap();
            (norms, export(&m), std::fs::read(&path).unwrap(), path)
        };
        let (resident, offloaded) = (run(false), run(true));
        assert!(resident.0[0] > 0.5, "the clipping bites: norm {}", resident.0[0]);
        assert_eq!(
            resident.0.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            offloaded.0.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(resident.1.len(), offloaded.1.len());
        for ((name, a), (_, b)) in resident.1.iter().zip(&offloaded.1) {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.data), bits(&b.data), "{name}");
        }
        assert_eq!(resident.2, offloaded.2, "the saved moments");
        // A checkpoint of either loads into either placement, and back.
        for offload in [false, true] {
            let mut loaded = AdamW::<Cpu>::load(&offloaded.3, &dev, offload).unwrap();
            assert_eq!(loaded.state.values().all(|m| matches!(m, Moments::Host(..))), offload);
            loaded.set_offload(!offload, &dev);
            loaded.set_offload(offload, &dev);
            loaded.save(&resident.3).unwrap();
            assert_eq!(std::fs::read(&resident.3).unwrap(), offloaded.2);
        }
    }

    /// `update` is `step` on a model nobody else holds: the same weights to the bit (the CPU's
    /// fused kernel then writes in place, where `step` on a shared model copies), each
    /// parameter's id and trainability kept, and no stand-in left behind.
    #[test]
    fn an_update_in_place_gives_the_steps_weights_and_keeps_the_parameters() {
        use crate::generate::score::response_hidden;
        use crate::model::weights::{export, small_random_model, weighted_head_loss};
        struct Ids(Vec<(String, String, bool)>);
        impl<B: AutodiffBackend> ParamVisitor<B> for Ids {
            fn vector(&mut self, name: &str, p: Param<Tensor<B, 1>>) -> Param<Tensor<B, 1>> {
                self.0.push((name.into(), p.id.to_string(), p.val().is_require_grad()));
                p
            }
            fn matrix(&mut self, name: &str, p: Param<Tensor<B, 2>>, _: bool) -> Param<Tensor<B, 2>> {
                self.0.push((name.into(), p.id.to_string(), p.val().is_require_grad()));
                p
            }
        }
        let ids = |m: &CausalLm<CpuAutodiff>| {
            let mut v = Ids(Vec::new());
            walk_params(m.clone(), &mut v);
            v.0
        };
        let grads = |m: &CausalLm<CpuAutodiff>| {
            let mut store = GradStore::default();
            let (hidden, _, _) = response_hidden(m, &[(vec![1u32, 2, 3], vec![4u32, 5, 6])]).unwrap();
            store.accumulate(m, &weighted_head_loss(m, hidden).backward());
            store
        };
        let config = AdamWConfig { lr: 1e-2, weight_decay: 0.1, ..AdamWConfig::default() };
        let (mut a, mut b) = (AdamW::<Cpu>::new(config.clone()), AdamW::<Cpu>::new(config));
        // Two models of the same values whose buffers are not shared.
        let (mut stepped, mut updated) =
            (small_random_model::<CpuAutodiff>(true, 5), small_random_model::<CpuAutodiff>(true, 5));
        let before = ids(&updated);
        assert!(before.iter().all(|(_, _, trainable)| *trainable));
        for _ in 0..2 {
            let g = grads(&stepped);
            stepped = a.step(stepped.clone(), g, 1e-2);
            let g = grads(&updated);
            b.update(&mut updated, g, 1e-2);
        }
        assert_eq!(ids(&updated), before);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (x, y) = (export(&stepped), export(&updated));
        assert_eq!(x.len(), y.len());
        for ((name, s), (_, u)) in x.iter().zip(&y) {
            assert_eq!(s.shape, u.shape, "{name}");
            assert_eq!(bits(&s.data), bits(&u.data), "{name}");
        }
        assert_ne!(bits(&x[0].1.data), bits(&export(&small_random_model::<CpuAutodiff>(true, 5))[0].1.data));
    }

    #[test]
    fn schedules() {
        let s = LrSchedule { kind: ScheduleKind::Cosine, warmup_updates: 2, min_ratio: 0.1 };
        assert_eq!(s.lr(1.0, 0, 10), 0.5);
        assert_eq!(s.lr(1.0, 1, 10), 1.0);
        assert!((s.lr(1.0, 2, 10) - 1.0).abs() < 1e-12);
        assert!((s.lr(1.0, 10, 10) - 0.1).abs() < 1e-12);
        assert_eq!(LrSchedule::default().lr(3e-6, 7, 10), 3e-6);
    }
}
