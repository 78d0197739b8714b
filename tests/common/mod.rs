//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use burn::tensor::{Int, Tensor, TensorData};
use hacpo::backend::Cpu;
use hacpo::model::CausalLm;

/// `tests/fixtures/<rel>`.
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(rel)
}

/// The shared data directory: `$HACPO_SHARED`, else `../shared` beside the checkout.
pub fn shared(rel: &str) -> PathBuf {
    let root = std::env::var_os("HACPO_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    let p = root.join(rel);
    assert!(p.exists(), "{} is missing: the tests need the shared assets (set HACPO_SHARED)", p.display());
    p
}

pub fn device() -> <Cpu as burn::tensor::backend::BackendTypes>::Device {
    Default::default()
}

/// Logits `[t, vocab]` of one unpadded sequence.
pub fn full_logits(model: &CausalLm<Cpu>, ids: &[u32]) -> Vec<Vec<f32>> {
    let t = ids.len();
    let input = Tensor::<Cpu, 2, Int>::from_data(
        TensorData::new(ids.iter().map(|&i| i as i64).collect::<Vec<_>>(), [1, t]),
        &device(),
    );
    let layout = model.layout_tensors(&hacpo::model::Layout::dense(1, t));
    let hidden = model.forward_hidden(input, &layout, None);
    let d = hidden.dims()[2];
    let logits = model.logits(hidden.reshape([t, d]));
    let v = logits.dims()[1];
    let flat = logits.into_data().into_vec::<f32>().unwrap();
    flat.chunks(v).map(<[f32]>::to_vec).collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// The `hacpo` binary built for these tests.
pub fn hacpo_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hacpo"))
}
