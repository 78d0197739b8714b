//! LoRA adapters (Hu et al., 2021) in PEFT's layout.
//!
//! A targeted projection computes `y = x W + b + (α/r) · (x A) B` with the base `W` frozen and
//! only `A: [in, r]` and `B: [r, out]` trained. `A` starts as PEFT's Kaiming-uniform draw and
//! `B` at zero, so an adapter starts as the identity on the base model. The base without its
//! adapters is the KL reference, so a LoRA policy needs no second copy of its weights.
//!
//! On disk an adapter is what `peft` writes and `PeftModel.from_pretrained` or vLLM's
//! `LoRARequest` read: `adapter_config.json` and `adapter_model.safetensors` with tensors named
//! `base_model.model.<module>.lora_A.weight` (`[r, in]`) and `…lora_B.weight` (`[out, r]`), the
//! transposes of how this crate stores them (as [`Linear`] does its weight).

use std::path::Path;

use burn::module::{Module, Param};
use burn::tensor::{Tensor, TensorData, backend::Backend};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::safetensors_io::{SafetensorsSource, SaveDtype, write_safetensors_file};
use super::transformer::{CausalLm, Linear};
use super::weights::{HostTensor, ParamVisitor, WeightSource, linears, map_linears, transposed, walk_params};
use crate::error::{Error, Result, write_atomic};

/// The file names PEFT uses.
pub const CONFIG_FILE: &str = "adapter_config.json";
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// The projections an adapter can target (HF module names).
pub const PROJECTIONS: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// `[agents.lora]`: which projections get adapters and how large.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// `r`: the inner dimension of `A` and `B`.
    pub rank: usize,
    /// `lora_alpha`: the update is scaled by `alpha / rank`.
    pub alpha: f64,
    /// `lora_dropout`: only 0 (see [`LoraConfig::validate`]).
    pub dropout: f64,
    /// HF module names (`q_proj`, …) or `all-linear`.
    pub target_modules: Vec<String>,
}

impl Default for LoraConfig {
    /// Rank 16 with α = 32 on every projection: the setting TRL's and verl's RL examples use.
    fn default() -> Self {
        LoraConfig {
            rank: 16,
            alpha: 32.0,
            dropout: 0.0,
            target_modules: PROJECTIONS.iter().map(|s| s.to_string()).collect(),
        }
    }
}

impl LoraConfig {
    /// Checks the settings; `at` names the table in messages (`agents[0].lora`).
    pub fn validate(&self, at: &str) -> std::result::Result<(), String> {
        if self.rank == 0 {
            return Err(format!("{at}.rank must be at least 1 (16 is a common choice)"));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(format!("{at}.alpha must be a positive number (often 2 × rank), got {}", self.alpha));
        }
        if self.dropout != 0.0 {
            return Err(format!(
                "{at}.dropout = {}: only 0 is supported. The update's importance ratio compares the log-probs the \
                 rollout scored with the ones the update computes; dropout in one and not the other makes them \
                 differ before any learning (verl and OpenRLHF train RL adapters without dropout)",
                self.dropout
            ));
        }
        if self.target_modules.is_empty() {
            return Err(format!(
                "{at}.target_modules is empty; name projections ({}) or all-linear",
                PROJECTIONS.join(", ")
            ));
        }
        for m in &self.target_modules {
            if m != "all-linear" && !PROJECTIONS.contains(&m.as_str()) {
                return Err(format!(
                    "{at}.target_modules: unknown module {m:?}; the projections are {} (or all-linear)",
                    PROJECTIONS.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// `alpha / rank`, PEFT's scaling without rsLoRA.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Whether an adapter wraps the projection `module` (`q_proj`, …).
    pub fn targets(&self, module: &str) -> bool {
        self.target_modules.iter().any(|m| m == "all-linear" || m == module)
    }

    /// The modules targeted, in PEFT's spelling.
    fn module_names(&self) -> Vec<String> {
        PROJECTIONS.iter().filter(|m| self.targets(m)).map(|m| m.to_string()).collect()
    }
}

/// The low-rank update of one projection.
#[derive(Module, Debug)]
pub struct LoraAdapter<B: Backend> {
    /// `[in, r]`
    pub a: Param<Tensor<B, 2>>,
    /// `[r, out]`
    pub b: Param<Tensor<B, 2>>,
    pub scale: f64,
}

impl<B: Backend> LoraAdapter<B> {
    /// `scale · (x A) B` for `x: [rows, in]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        x.matmul(self.a.val()).matmul(self.b.val()).mul_scalar(self.scale)
    }

    /// The dense update `scale · A B`, `[in, out]`.
    fn delta(&self) -> Tensor<B, 2> {
        self.a.val().matmul(self.b.val()).mul_scalar(self.scale)
    }
}

/// Whether any projection of `model` carries an adapter.
pub fn has_adapters<B: Backend>(model: &CausalLm<B>) -> bool {
    linears(model).any(|(_, l)| l.lora.is_some())
}

/// The model with every weight trainable or frozen (no gradient computed or kept for it).
pub fn set_trainable<B: Backend>(model: CausalLm<B>, trainable: bool) -> CausalLm<B> {
    struct Set(bool);
    impl<B: Backend> ParamVisitor<B> for Set {
        fn vector(&mut self, _: &str, p: Param<Tensor<B, 1>>) -> Param<Tensor<B, 1>> {
            p.set_require_grad(self.0)
        }
        fn matrix(&mut self, _: &str, p: Param<Tensor<B, 2>>, _: bool) -> Param<Tensor<B, 2>> {
            p.set_require_grad(self.0)
        }
    }
    walk_params(model, &mut Set(trainable))
}

fn freeze<B: Backend>(model: CausalLm<B>) -> CausalLm<B> {
    set_trainable(model, false)
}

/// Freezes `model` and gives each targeted projection a fresh adapter: `A` uniform in
/// ±1/√in (PEFT's `kaiming_uniform_(a=√5)`), `B` zero, drawn from `seed`.
pub fn attach<B: Backend>(model: CausalLm<B>, config: &LoraConfig, seed: u64) -> CausalLm<B> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let device = model.device();
    let r = config.rank;
    map_linears(freeze(model), |_, module, linear| {
        if !config.targets(module) {
            return Ok(linear);
        }
        let [inp, out] = linear.weight.dims();
        let bound = 1.0 / (inp as f32).sqrt();
        let a: Vec<f32> = (0..inp * r).map(|_| rng.random_range(-bound..bound)).collect();
        let adapter = LoraAdapter {
            a: Param::from_tensor(Tensor::from_data(TensorData::new(a, [inp, r]), &device)),
            b: Param::from_tensor(Tensor::zeros([r, out], &device)),
            scale: config.scale(),
        };
        Ok(Linear { lora: Some(adapter), ..linear })
    })
    .expect("attaching cannot fail")
}

/// The base model: every adapter removed (the weights are shared, not copied).
pub fn strip<B: Backend>(model: CausalLm<B>) -> CausalLm<B> {
    map_linears(model, |_, _, linear| Ok(Linear { lora: None, ..linear })).expect("stripping cannot fail")
}

/// The model with every adapter folded into its projection, `W + scale · A B` (a new leaf
/// weight, not a function of the adapter).
pub fn merge<B: Backend>(model: CausalLm<B>) -> CausalLm<B> {
    map_linears(model, |_, _, linear| {
        Ok(match linear.lora {
            None => linear,
            Some(adapter) => {
                let trainable = linear.weight.is_require_grad();
                let base = crate::dtype::f32_weight(linear.weight.val());
                let merged = (base + adapter.delta()).detach().set_require_grad(trainable);
                Linear {
                    weight: Param::from_tensor(merged).set_require_grad(trainable),
                    lora: None,
                    bias: linear.bias,
                    packed: None,
                }
            }
        })
    })
    .expect("merging cannot fail")
}

/// What `base_model_name_or_path` should say for a policy whose model is `spec`: a zoo
/// entry's Hub repo id, a local path made absolute, else `spec` itself.
pub fn base_name(spec: &str) -> String {
    if let Some(entry) = super::zoo::find(spec) {
        return entry.repo;
    }
    match std::fs::canonicalize(spec) {
        Ok(path) => path.display().to_string(),
        Err(_) => spec.to_string(),
    }
}

/// The adapter tensors of `model` under PEFT's names and in PEFT's layout.
pub fn adapter_tensors<B: Backend>(model: &CausalLm<B>) -> Vec<(String, HostTensor)> {
    linears(model)
        .filter_map(|(name, linear)| linear.lora.as_ref().map(|a| (name, a)))
        .flat_map(|(name, a)| {
            [
                (format!("base_model.model.{name}.lora_A.weight"), HostTensor::of(a.a.val().transpose())),
                (format!("base_model.model.{name}.lora_B.weight"), HostTensor::of(a.b.val().transpose())),
            ]
        })
        .collect()
}

/// Writes `model`'s adapters to `dir` as PEFT does. `base` is what `base_model_name_or_path`
/// names: a Hub repo id or an absolute local path, so that `peft` finds the base model too.
pub fn save_adapter<B: Backend>(model: &CausalLm<B>, config: &LoraConfig, base: &str, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    write_safetensors_file(&dir.join(WEIGHTS_FILE), adapter_tensors(model), SaveDtype::F32)?;
    let peft = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": config.module_names(),
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "use_rslora": false,
        "use_dora": false,
        "modules_to_save": null,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": null,
    });
    write_atomic(&dir.join(CONFIG_FILE), serde_json::to_string_pretty(&peft).expect("json").as_bytes())
}

/// Whether `dir` holds a PEFT adapter.
pub fn is_adapter_dir(dir: &Path) -> bool {
    dir.join(CONFIG_FILE).is_file()
}

/// What an adapter directory's `adapter_config.json` says.
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterInfo {
    pub base: String,
    pub rank: usize,
    pub scale: f64,
}

/// Reads and checks `dir/adapter_config.json`: a plain LoRA adapter (no DoRA, per-module
/// ranks, bias training or extra saved modules, which this crate does not apply).
pub fn read_adapter_info(dir: &Path) -> Result<AdapterInfo> {
    let path = dir.join(CONFIG_FILE);
    let bad = |m: String| Error::config(path.display().to_string(), m);
    let v: Value =
        serde_json::from_str(&crate::error::read_to_string(&path)?).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let peft_type = v["peft_type"].as_str().unwrap_or("");
    if peft_type != "LORA" {
        return Err(bad(format!("peft_type is {peft_type:?}; only LORA adapters are supported")));
    }
    let rank = v["r"].as_u64().filter(|&r| r > 0).ok_or_else(|| bad("\"r\" must be a positive integer".into()))?;
    let alpha = v["lora_alpha"].as_f64().ok_or_else(|| bad("\"lora_alpha\" is missing".into()))?;
    let unsupported = [
        ("use_dora", v["use_dora"].as_bool() == Some(true)),
        ("fan_in_fan_out", v["fan_in_fan_out"].as_bool() == Some(true)),
        ("bias", v["bias"].as_str().is_some_and(|b| b != "none")),
        ("lora_bias", v["lora_bias"].as_bool() == Some(true)),
        ("rank_pattern", v["rank_pattern"].as_object().is_some_and(|m| !m.is_empty())),
        ("alpha_pattern", v["alpha_pattern"].as_object().is_some_and(|m| !m.is_empty())),
        ("modules_to_save", v["modules_to_save"].as_array().is_some_and(|m| !m.is_empty())),
    ];
    if let Some((key, _)) = unsupported.iter().find(|(_, on)| *on) {
        return Err(bad(format!(
            "{key} = {} is not supported; hacpo applies plain LoRA adapters (merge this one with peft's \
             merge_and_unload() and load the merged model instead)",
            v[key]
        )));
    }
    let scale =
        if v["use_rslora"].as_bool() == Some(true) { alpha / (rank as f64).sqrt() } else { alpha / rank as f64 };
    let base = v["base_model_name_or_path"].as_str().unwrap_or("").to_string();
    Ok(AdapterInfo { base, rank: rank as usize, scale })
}

/// Gives `model` (frozen first) the adapters stored in `dir`, trainable. Every tensor in the
/// file must land on a projection of the model, with the shapes the model implies.
pub fn load_adapter<B: Backend>(model: CausalLm<B>, dir: &Path) -> Result<CausalLm<B>> {
    let info = read_adapter_info(dir)?;
    let path = dir.join(WEIGHTS_FILE);
    if !path.is_file() {
        let hint = if dir.join("adapter_model.bin").is_file() {
            "adapter_model.bin (pickle) is not read; save the adapter with safe_serialization=True"
        } else {
            "a PEFT adapter directory holds adapter_config.json and adapter_model.safetensors"
        };
        return Err(Error::NotFound { what: "adapter weights".into(), path, hint: hint.into() });
    }
    let mut source = SafetensorsSource::open_file(&path)?;
    // PEFT drops the adapter name on save; an unmerged in-memory dump keeps `.default`.
    let mut by_module: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    for name in source.names() {
        let key = name.strip_prefix("base_model.model.").unwrap_or(&name).replace(".default.weight", ".weight");
        by_module.insert(key, name);
    }
    let device = model.device();
    let mut take = |key: &str, shape: [usize; 2]| -> Result<Option<Tensor<B, 2>>> {
        let Some(name) = by_module.remove(key) else { return Ok(None) };
        let t = source.take(&name)?.expect("listed tensor");
        if t.shape != shape {
            return Err(Error::WeightShape {
                name,
                file: path.display().to_string(),
                expected: shape.to_vec(),
                found: t.shape,
            });
        }
        if let Some(bad) = t.data.iter().find(|x| !x.is_finite()) {
            return Err(Error::WeightFile {
                path: path.clone(),
                message: format!("adapter tensor {name} holds a non-finite value ({bad})"),
            });
        }
        // PEFT's [r, in] / [out, r] → this crate's [in, r] / [r, out], as the loader does for
        // a projection's weight.
        let [rows, cols] = shape;
        let data = transposed(&t.data, rows, cols);
        Ok(Some(Tensor::<B, 2>::from_data(TensorData::new(data, [cols, rows]), &device)))
    };
    let r = info.rank;
    let model = map_linears(freeze(model), |name, _, linear| {
        let [inp, out] = linear.weight.dims();
        let a = take(&format!("{name}.lora_A.weight"), [r, inp])?;
        let b = take(&format!("{name}.lora_B.weight"), [out, r])?;
        Ok(match (a, b) {
            (Some(a), Some(b)) => Linear {
                lora: Some(LoraAdapter { a: Param::from_tensor(a), b: Param::from_tensor(b), scale: info.scale }),
                ..linear
            },
            (None, None) => linear,
            _ => {
                return Err(Error::WeightFile {
                    path: path.clone(),
                    message: format!("{name} has only one of lora_A and lora_B"),
                });
            }
        })
    })?;
    if let Some(left) = by_module.values().next() {
        return Err(Error::WeightFile {
            path,
            message: format!(
                "tensor {left} (and {} more) does not belong to a q/k/v/o or MLP projection of this model; \
                 the adapter was trained for another architecture or holds modules hacpo does not apply",
                by_module.len() - 1
            ),
        });
    }
    if !has_adapters(&model) {
        return Err(Error::WeightFile { path, message: "the file holds no lora_A/lora_B tensors".into() });
    }
    Ok(model)
}

/// The number of trainable adapter parameters `config` adds to a model of shape `c`.
pub fn adapter_parameters(c: &super::ModelConfig, config: &LoraConfig) -> u64 {
    let (d, q, kv, f) =
        (c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, c.intermediate_size);
    let dims = [
        ("q_proj", d, q),
        ("k_proj", d, kv),
        ("v_proj", d, kv),
        ("o_proj", q, d),
        ("gate_proj", d, f),
        ("up_proj", d, f),
        ("down_proj", f, d),
    ];
    let per_layer: usize = dims.iter().filter(|(m, ..)| config.targets(m)).map(|(_, i, o)| config.rank * (i + o)).sum();
    (per_layer * c.num_hidden_layers) as u64
}

/// Test helpers shared with `precision`'s tests.
#[cfg(test)]
pub(crate) mod tests {
    use burn::backend::Autodiff;
    use burn::tensor::Int;

    use super::*;
    use crate::backend::Cpu;
    use crate::model::weights::{RandomWeights, build};
    use crate::model::{Layout, ModelConfig};

    /// A Qwen2-shaped model (q/k/v biases, GQA 4/2) small enough for a unit test.
    pub(crate) fn model<B: Backend>(tied: bool) -> CausalLm<B> {
        let v = serde_json::json!({
            "model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 64,
            "tie_word_embeddings": tied
        });
        let config = ModelConfig::from_json(&v, "test").unwrap();
        build::<B>(&config, &mut RandomWeights::new(&config, 3, 0.2), &Default::default()).unwrap()
    }

    /// The logits `[7, vocab]` of a fixed 7-token prompt, on the model's backend.
    pub(crate) fn logits_tensor<B: Backend>(m: &CausalLm<B>) -> Tensor<B, 2> {
        let ids = [5i64, 9, 1, 33, 60, 2, 17];
        let t = ids.len();
        let input = Tensor::<B, 2, Int>::from_data(TensorData::new(ids.to_vec(), [1, t]), &m.device());
        let hidden = m.forward_hidden(input, &m.layout_tensors(&Layout::dense(1, t)), None);
        m.logits(hidden.reshape([t, 32]))
    }

    /// [`logits_tensor`] on the host.
    pub(crate) fn logits<B: Backend>(m: &CausalLm<B>) -> Vec<f32> {
        logits_tensor(m).into_data().convert::<f32>().into_vec().unwrap()
    }

    pub(crate) fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    /// Every adapter's `B` drawn at random, as after some training.
    fn trained<B: Backend>(m: CausalLm<B>, seed: u64) -> CausalLm<B> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        map_linears(m, |_, _, mut l| {
            if let Some(a) = &mut l.lora {
                let [r, out] = a.b.dims();
                let data: Vec<f32> = (0..r * out).map(|_| rng.random_range(-0.3..0.3)).collect();
                a.b = Param::from_tensor(Tensor::from_data(TensorData::new(data, [r, out]), &Default::default()));
            }
            Ok(l)
        })
        .unwrap()
    }

    fn small() -> LoraConfig {
        LoraConfig { rank: 4, alpha: 8.0, ..Default::default() }
    }

    #[test]
    fn a_fresh_adapter_leaves_the_model_unchanged() {
        let base = model::<Cpu>(false);
        let adapted = attach(base.clone(), &small(), 1);
        assert!(has_adapters(&adapted));
        assert_eq!(logits(&adapted), logits(&base));
    }

    #[test]
    fn merged_weights_equal_the_adapter_forward_and_stripping_gives_the_base() {
        let base = model::<Cpu>(false);
        let adapted = trained(attach(base.clone(), &small(), 1), 2);
        let with_adapter = logits(&adapted);
        assert!(max_diff(&with_adapter, &logits(&base)) > 1e-2, "the adapter changes the model");
        let merged = merge(adapted.clone());
        assert!(!has_adapters(&merged));
        let d = max_diff(&with_adapter, &logits(&merged));
        assert!(d <= 1e-5, "merged vs adapter forward: {d}");
        assert_eq!(logits(&strip(adapted)), logits(&base));
    }

    #[test]
    fn an_adapter_saved_in_peft_layout_loads_back_onto_the_base() {
        let base = model::<Cpu>(false);
        let config =
            LoraConfig { target_modules: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()], ..small() };
        let adapted = trained(attach(base.clone(), &config, 1), 2);
        let dir = tempfile::tempdir().unwrap();
        save_adapter(&adapted, &config, "Qwen/Qwen2.5-1.5B-Instruct", dir.path()).unwrap();

        let peft: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join(CONFIG_FILE)).unwrap()).unwrap();
        assert_eq!(
            (peft["peft_type"].as_str(), peft["r"].as_u64(), peft["lora_alpha"].as_f64()),
            (Some("LORA"), Some(4), Some(8.0))
        );
        assert_eq!(peft["target_modules"], serde_json::json!(["q_proj", "v_proj", "down_proj"]));
        let info = read_adapter_info(dir.path()).unwrap();
        assert_eq!((info.base.as_str(), info.rank, info.scale), ("Qwen/Qwen2.5-1.5B-Instruct", 4, 2.0));

        let mut file = SafetensorsSource::open_file(&dir.path().join(WEIGHTS_FILE)).unwrap();
        let mut names = file.names();
        names.sort();
        assert_eq!(names.len(), 2 * 3 * 2, "A and B of 3 modules in 2 layers");
        assert!(names.contains(&"base_model.model.model.layers.1.mlp.down_proj.lora_A.weight".to_string()));
        // PEFT's nn.Linear layouts: lora_A [r, in], lora_B [out, r].
        let a = file.take("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").unwrap().unwrap();
        let b = file.take("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight").unwrap().unwrap();
        assert_eq!((a.shape, b.shape), (vec![4, 32], vec![32, 4]));

        let loaded = load_adapter(base.clone(), dir.path()).unwrap();
        assert_eq!(logits(&loaded), logits(&adapted));
        // Onto a model of another shape: a clear error, not a panic.
        let other = attach(base, &LoraConfig { rank: 2, ..small() }, 1);
        let dir2 = tempfile::tempdir().unwrap();
        save_adapter(&other, &LoraConfig { rank: 2, ..small() }, "x", dir2.path()).unwrap();
        std::fs::copy(dir.path().join(CONFIG_FILE), dir2.path().join(CONFIG_FILE)).unwrap();
        let e = load_adapter(model::<Cpu>(false), dir2.path()).unwrap_err().to_string();
        assert!(e.contains("lora_A.weight") && e.contains("shape"), "{e}");
    }

    #[test]
    fn only_the_adapters_receive_gradients() {
        type Ad = Autodiff<Cpu>;
        let adapted = trained(attach(model::<Ad>(false), &small(), 1), 2);
        let grads = logits_tensor(&adapted).powi_scalar(2).mean().backward();
        let mut store = crate::train::optim::GradStore::<Cpu>::default();
        store.accumulate(&adapted, &grads);
        let names = store.names();
        assert_eq!(names.len(), 2 * 7 * 2, "A and B of all 7 projections in 2 layers: {names:?}");
        assert!(names.iter().all(|n| n.contains(".lora_A.") || n.contains(".lora_B.")), "{names:?}");
    }

    #[test]
    fn the_parameter_count_matches_the_attached_adapters() {
        let base = model::<Cpu>(false);
        for config in [small(), LoraConfig { target_modules: vec!["o_proj".into(), "up_proj".into()], ..small() }] {
            let adapted = attach(base.clone(), &config, 1);
            let n: usize = adapter_tensors(&adapted).iter().map(|(_, t)| t.data.len()).sum();
            assert_eq!(adapter_parameters(&adapted.config, &config), n as u64);
        }
    }

    #[test]
    fn settings_are_checked() {
        assert!(LoraConfig::default().validate("lora").is_ok());
        let bad = |c: LoraConfig| c.validate("agents[0].lora").unwrap_err();
        assert!(bad(LoraConfig { rank: 0, ..Default::default() }).contains("rank"));
        assert!(bad(LoraConfig { dropout: 0.05, ..Default::default() }).contains("only 0"));
        assert!(
            bad(LoraConfig { target_modules: vec!["qkv".into()], ..Default::default() }).contains("unknown module")
        );
        assert!(bad(LoraConfig { alpha: f64::NAN, ..Default::default() }).contains("alpha"));
    }
}
