//! `hacpo train` on the turn-wise workload as a user runs it: tiny random policies around the
//! real Qwen3 and Llama-3.1 tokenizers play Plan-Path as a tool and a plan role, trained with
//! AT-GRPO and its baselines; checkpoints, SIGKILL and `--resume`; errors for bad input.

mod common;

use std::path::{Path, PathBuf};

use common::{deterministic_metrics as metrics, output_text as text, rejects, run_hacpo as run, succeeded as ok};
use serde_json::Value;

/// Words the random policies favour, so that many answers hold a readable move list (`[R D]`,
/// `[]`) and some do not: rewards vary within groups.
const MOVES: &[&str] = &[" [", " R", " D", " ]"];

struct Setup {
    _agents: [tempfile::TempDir; 2],
    dir: tempfile::TempDir,
    qwen: PathBuf,
    llama: PathBuf,
}

fn setup() -> Setup {
    let qwen = common::tiny_agent_writing("qwen3", "qwen3", 32, 3, MOVES, false);
    let llama = common::tiny_agent_writing("llama3.1", "llama", 40, 4, MOVES, false);
    let (q, l) = (qwen.path().to_path_buf(), llama.path().to_path_buf());
    Setup { _agents: [qwen, llama], dir: tempfile::tempdir().unwrap(), qwen: q, llama: l }
}

impl Setup {
    /// A config: `algo` with the Qwen policy in both roles, or (`per_role`) the Qwen policy as
    /// the tool and the Llama one as the planner.
    fn config(&self, algo: &str, per_role: bool, extra: &str) -> PathBuf {
        let qwen = format!(
            "[[policies]]\nname = \"qwen\"\nmodel = \"{}\"\nchat_template_kwargs = {{ enable_thinking = false }}\n",
            self.qwen.display()
        );
        let policies = if per_role {
            format!(
                "{qwen}\n[[policies]]\nname = \"llama\"\nmodel = \"{}\"\n\n[[roles]]\nname = \"tool\"\npolicies = [\"qwen\"]\n\n[[roles]]\nname = \"plan\"\npolicies = [\"llama\"]\n",
                self.llama.display()
            )
        } else {
            qwen
        };
        let toml = format!(
            r#"
[run]
seed = 5
steps = 3
checkpoint_every = 1

[workload]
kind = "turns"

[workload.turns]
turns = 2

[algo]
name = "{algo}"
group_size = 2
prompts_per_step = 2
minibatch_prompts = 1
micro_batch_sequences = 8

[algo.optimizer]
lr = 1e-3

[rollout]
max_new_tokens = 8
batch_prompts = 8
max_prompt_tokens = 1024

[task]
kind = "env"
train = "plan-path"
val_every = 3
val_max_new_tokens = 8

[task.env]
train_instances = 6
heldout_instances = 2
{extra}
{policies}"#
        );
        let path = self.dir.path().join(format!("{algo}-{per_role}.toml"));
        std::fs::write(&path, toml).unwrap();
        path
    }
}

fn get(record: &Value, key: &str) -> f64 {
    record["data"][key].as_f64().unwrap_or_else(|| panic!("no {key} in {record}"))
}

/// `hacpo train ARGS --out DIR` killed right after its step-2 checkpoint, then `--resume DIR`.
fn killed_and_resumed(args: &[&str], dir: &Path) -> Vec<Value> {
    let mut all = vec!["train", "--out", dir.to_str().unwrap()];
    all.extend(args);
    common::train_killed_after_checkpoint(&all, 2);
    ok(run(&["train", "--resume", dir.to_str().unwrap()]));
    metrics(dir)
}

#[test]
fn atgrpo_forms_groups_of_k_per_turn_trains_and_resumes_after_sigkill() {
    let s = setup();
    let cfg = s.config("atgrpo", false, "");
    let cfg = cfg.to_str().unwrap();
    let reference = s.dir.path().join("reference");
    let log = text(&ok(run(&["train", "--config", cfg, "--out", reference.to_str().unwrap()])));
    assert!(log.contains("held-out success before training"), "{log}");
    let m = metrics(&reference);
    assert_eq!(m.len(), 3);
    for r in &m {
        // Every decision's K = 2 branches share one prompt: groups of exactly 2.
        assert_eq!(get(r, "turns/group_size"), 2.0, "{r}");
        assert_eq!(get(r, "turns/singleton_groups"), 0.0);
        // Two episodes, up to two turns, two roles, two branches.
        let outputs = get(r, "turns/outputs");
        assert!((8.0..=16.0).contains(&outputs) && outputs % 4.0 == 0.0, "{r}");
        for key in ["turns/success_rate", "turns/invalid_action_rate", "turns/unreadable_rate"] {
            assert!((0.0..=1.0).contains(&get(r, key)), "{key}: {r}");
        }
        assert_eq!(get(r, "turns/tool_error_rate"), 0.0, "the simulate tool never errs");
        assert!(get(r, "turns/tool/reward").is_finite() && get(r, "turns/plan/reward").is_finite());
        assert!(get(r, "actor/grad_norm").is_finite());
    }
    assert!(m.iter().any(|r| get(r, "actor/pg_loss") != 0.0), "some group's rewards differ: {m:?}");
    assert!((0.0..=1.0).contains(&get(&m[2], "val/success")) && m[2]["data"].get("val/mean_turns").is_some());

    let killed = s.dir.path().join("killed");
    assert_eq!(killed_and_resumed(&["--config", cfg], &killed), m);
}

#[test]
fn per_role_policies_with_different_tokenizers_and_the_baselines_train() {
    let s = setup();
    let per_role = s.config("atgrpo", true, "");
    let out = s.dir.path().join("per-role");
    ok(run(&["train", "--config", per_role.to_str().unwrap(), "--out", out.to_str().unwrap(), "--steps", "2"]));
    let m = metrics(&out);
    let agents: Vec<&str> = m.iter().map(|r| r["agent"].as_str().unwrap()).collect();
    assert!(agents.contains(&"qwen") && agents.contains(&"llama"), "{agents:?}");

    // Whole trajectories: groups of at most K (identical prompts only).
    let mas = s.config("mas-grpo", false, "");
    let out = s.dir.path().join("mas");
    ok(run(&["train", "--config", mas.to_str().unwrap(), "--out", out.to_str().unwrap(), "--steps", "2"]));
    for r in metrics(&out) {
        let size = get(&r, "turns/group_size");
        assert!((1.0..=2.0).contains(&size), "{r}");
    }

    // The plan role alone: no tool outputs.
    let single = s.config("single-grpo", false, "");
    let out = s.dir.path().join("single");
    ok(run(&["train", "--config", single.to_str().unwrap(), "--out", out.to_str().unwrap(), "--steps", "1"]));
    let r = &metrics(&out)[0];
    assert!(r["data"].get("turns/tool/reward").is_none(), "{r}");
    assert!(get(r, "turns/plan/reward").is_finite());
}

#[test]
fn the_python_tool_runs_the_tool_roles_programs() {
    let s = setup();
    let cfg = s.config("atgrpo", false, "\n[workload.turns.python]\ntimeout_s = 2.0\n");
    let toml = std::fs::read_to_string(&cfg).unwrap().replace("turns = 2", "turns = 1\ntool = \"python\"");
    std::fs::write(&cfg, toml).unwrap();
    let out = s.dir.path().join("python");
    ok(run(&["train", "--config", cfg.to_str().unwrap(), "--out", out.to_str().unwrap(), "--steps", "1"]));
    let r = &metrics(&out)[0];
    // A random policy's "programs" fail to run: tool errors, shown to the planner, not fatal.
    assert!(get(r, "turns/tool_error_rate") > 0.0, "{r}");
}

#[test]
fn bad_turn_wise_input_gets_clear_errors() {
    let s = setup();
    let cfg = s.config("atgrpo", false, "");
    let c = cfg.to_str().unwrap();
    rejects(
        &["train", "--config", c, "--dry-run", "--set", "algo.name=\"grpo\""],
        &["atgrpo, mas-grpo or single-grpo"],
    );
    rejects(&["train", "--config", c, "--dry-run", "--set", "task.train=\"chess\""], &["task.train", "plan-path"]);
    rejects(&["train", "--config", c, "--dry-run", "--set", "workload.kind=\"exchange\""], &["kind = \"turns\""]);
    rejects(&["train", "--config", c, "--dry-run", "--set", "workload.turns.turns=0"], &["workload.turns.turns"]);
    rejects(&["train", "--config", c, "--dry-run", "--set", "workload.turns.alpha=-1.0"], &["workload.turns.alpha"]);
    let per_role = s.config("single-grpo", true, "");
    rejects(&["train", "--config", per_role.to_str().unwrap(), "--dry-run"], &["\"qwen\" plays no role"]);
}

/// The tiny Plan-Path study's config as a user first runs it: its planner is pre-trained into an
/// empty cache (a short budget here; the recipe's own takes about 20 minutes), and the team
/// trains a step, played greedily on held-out grids before and after. The planner is
/// pre-trained for the simulate tool's prompts only, and says so.
#[test]
fn the_tiny_planpath_config_pretrains_its_planner_and_trains() {
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("run");
    let o = ok(common::hacpo_command(&[
        "train",
        "--config",
        "configs/tiny-planpath.toml",
        "--steps",
        "1",
        "--out",
        dir.to_str().unwrap(),
        "--set",
        "task.val_limit=4",
        "--set",
        "pretrain.max_steps=2",
        "--set",
        "algo.prompts_per_step=2",
        "--set",
        "algo.minibatch_prompts=2",
    ])
    .env("HACPO_CACHE", cache.path())
    .output()
    .unwrap());
    let log = text(&o);
    assert!(log.contains("pre-training tiny-planner") && log.contains("right: tool"), "{log}");
    let m = metrics(&dir);
    for key in ["turns/success_rate", "turns/group_size", "turns/plan/reward"] {
        assert!(m[0]["data"][key].is_number(), "{key} missing: {}", m[0]);
    }
    assert_eq!(get(&m[0], "turns/group_size"), 4.0);
    rejects(
        &["train", "--config", "configs/tiny-planpath.toml", "--dry-run", "--set", "workload.turns.tool=\"python\""],
        &["tiny-planner", "workload.turns.tool = \"simulate\""],
    );
}
