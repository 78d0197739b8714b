//! Model resolution: the one entry point from a policy's `model` string (a local path, a zoo
//! id, or the id of an embedded tiny agent) to what the loader reads. The trainer calls this
//! and never learns about the tiny agents.

use std::path::Path;

use burn::tensor::backend::Backend;

use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::model::zoo;

/// Fails fast on an unknown model id, or a tiny agent the config's task cannot use, before any
/// model or dataset is loaded.
pub fn check_known(cfg: &TrainConfig) -> Result<()> {
    for p in &cfg.policies {
        if Path::new(&p.model).exists() || zoo::find(&p.model).is_some() {
            continue;
        }
        match crate::tiny::find(&p.model) {
            Some(_) => crate::tiny::check_task(&p.model, cfg)?,
            None => return Err(unknown_model(&p.model)),
        }
    }
    Ok(())
}

/// The error for a model string that is no path, zoo id or tiny id, listing the known ids.
pub fn unknown_model(id: &str) -> Error {
    let mut known: Vec<String> = zoo::entries().iter().map(|e| e.id.clone()).collect();
    known.extend(crate::tiny::ids().into_iter().map(String::from));
    Error::UnknownModel { id: id.into(), known: known.join(", ") }
}

/// Makes every policy's model loadable: pre-trains (and caches) the tiny agents the config
/// names, on `device`. Other models are fetched by the loader itself.
pub fn prepare<B: Backend>(cfg: &TrainConfig, device: &B::Device) -> Result<()> {
    crate::tiny::prepare_agents::<B>(cfg, device)
}

/// What the loader reads for a policy's `model`: a tiny id's cached directory, else the spec
/// itself (a path or a zoo id).
pub fn model_source(spec: &str, cfg: &TrainConfig) -> Result<String> {
    crate::tiny::resolve(spec, cfg)
}
