//! Who plays what: the `[[roles]]` entries of a config against its policies, resolved once for
//! every workload. A workload with one shared role (the exchange) takes [`RoleMap::shared`];
//! a workload with fixed roles played by one policy each (search, turns) takes
//! [`RoleMap::players`], which also checks that every policy plays one of them (the exchange
//! checks its one role itself).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::task::TaskPrompt;
use crate::tokenizer::Message;

/// One role of a workload (`[[roles]]`): its name, the policies that play it, and how the
/// task's prompt is put to it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleConfig {
    pub name: String,
    /// Policy names (or indices as strings) that play the role; empty: every policy.
    #[serde(default)]
    pub policies: Vec<String>,
    /// The user message, with `{prompt}` standing for the task's (default: the task's as is).
    #[serde(default)]
    pub template: Option<String>,
}

/// A role of a workload: its name, the policies that play it and how a prompt is put to it.
#[derive(Clone, Debug, PartialEq)]
pub struct Role {
    pub name: String,
    /// Indices of the policies that play it.
    pub policies: Vec<usize>,
    /// The user message with `{prompt}` for the task's; `None`: the task's messages as they are.
    pub template: Option<String>,
}

impl Role {
    /// The messages this role sees for a task prompt.
    pub fn messages(&self, prompt: &TaskPrompt) -> Vec<Message> {
        let Some(template) = &self.template else { return prompt.messages.clone() };
        let mut messages = prompt.messages.clone();
        if let Some(last) = messages.iter_mut().rev().find(|m| m.role == "user") {
            last.content = template.replace("{prompt}", &last.content);
        }
        messages
    }
}

/// The policies' display names and the `[[roles]]` entries, as a workload needs them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoleMap {
    /// Display names, indexed like the policies.
    pub policies: Vec<String>,
    pub roles: Vec<RoleConfig>,
}

fn bad<T>(m: String) -> Result<T> {
    Err(Error::config("training config", m))
}

impl RoleMap {
    /// The policy a role entry names: a display name, or an index.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.policies
            .iter()
            .position(|p| p == name)
            .or_else(|| name.parse::<usize>().ok().filter(|&k| k < self.policies.len()))
    }

    /// The roles as entered, or every policy in the one role `solver`; an entry without
    /// policies is played by every policy.
    pub fn shared(&self) -> Vec<Role> {
        let everyone = || (0..self.policies.len()).collect::<Vec<_>>();
        if self.roles.is_empty() {
            return vec![Role { name: "solver".into(), policies: everyone(), template: None }];
        }
        self.roles
            .iter()
            .map(|r| Role {
                name: r.name.clone(),
                policies: if r.policies.is_empty() {
                    everyone()
                } else {
                    r.policies.iter().filter_map(|p| self.index(p)).collect()
                },
                template: r.template.clone(),
            })
            .collect()
    }

    /// The one policy that plays each of a workload's fixed `roles` (built-in prompts, no
    /// templates): with one policy, it plays them all; else `[[roles]]` names each role in
    /// `needed` (indices into `roles`) once, with one policy, and every policy plays one of
    /// them. Roles not needed and not named are `None`.
    pub fn players(&self, workload: &str, roles: &[&str], needed: &[usize]) -> Result<Vec<Option<usize>>> {
        let list = |which: &[usize]| which.iter().map(|&r| roles[r]).collect::<Vec<_>>().join(", ");
        if self.roles.is_empty() {
            if self.policies.len() != 1 {
                return bad(format!(
                    "roles: with {} policies the {workload} workload needs [[roles]] entries for {} naming the one policy that plays each",
                    self.policies.len(),
                    list(needed)
                ));
            }
            return Ok(roles.iter().map(|_| Some(0)).collect());
        }
        let mut players = vec![None; roles.len()];
        for (i, r) in self.roles.iter().enumerate() {
            let Some(k) = roles.iter().position(|n| *n == r.name) else {
                let all: Vec<usize> = (0..roles.len()).collect();
                return bad(format!(
                    "roles[{i}].name: the {workload} workload's roles are {}, not {:?}",
                    list(&all),
                    r.name
                ));
            };
            if players[k].is_some() {
                return bad(format!("roles[{i}].name: {:?} is given twice", r.name));
            }
            if r.template.is_some() {
                return bad(format!("roles[{i}].template: the {workload} roles' prompts are built in; leave it out"));
            }
            players[k] = Some(match r.policies.as_slice() {
                [] if self.policies.len() == 1 => 0,
                [p] => self
                    .index(p)
                    .ok_or_else(|| Error::config("training config", format!("roles[{i}].policies: no policy {p:?}")))?,
                _ => {
                    return bad(format!("roles[{i}].policies: one policy plays the {} role; name exactly one", r.name));
                }
            });
        }
        let missing: Vec<usize> = needed.iter().copied().filter(|&r| players[r].is_none()).collect();
        if !missing.is_empty() {
            return bad(format!("roles: no [[roles]] entry for {}", list(&missing)));
        }
        let played: Vec<usize> = needed.iter().filter_map(|&r| players[r]).collect();
        if let Some(k) = (0..self.policies.len()).find(|k| !played.contains(k)) {
            let only =
                if needed.len() < roles.len() { format!(" (only {} plays here)", list(needed)) } else { String::new() };
            return bad(format!(
                "roles: policy {:?} plays no role{only}; give it one or remove it from [[policies]]",
                self.policies[k]
            ));
        }
        Ok(players)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(policies: &[&str], roles: &[(&str, &[&str])]) -> RoleMap {
        RoleMap {
            policies: policies.iter().map(|p| p.to_string()).collect(),
            roles: roles
                .iter()
                .map(|(n, ps)| RoleConfig {
                    name: n.to_string(),
                    policies: ps.iter().map(|p| p.to_string()).collect(),
                    template: None,
                })
                .collect(),
        }
    }

    #[test]
    fn a_role_template_wraps_the_last_user_message() {
        let p = TaskPrompt { id: "1".into(), messages: vec![Message::user("2+2?")], gold: "4".into() };
        let plain = Role { name: "solver".into(), policies: vec![0], template: None };
        assert_eq!(plain.messages(&p), p.messages);
        let wrapped = Role { template: Some("Q: {prompt}\nA:".into()), ..plain };
        assert_eq!(wrapped.messages(&p)[0].content, "Q: 2+2?\nA:");
    }

    #[test]
    fn shared_roles_default_to_one_solver_role_of_everyone() {
        let roles = map(&["a", "b"], &[]).shared();
        assert_eq!(roles, vec![Role { name: "solver".into(), policies: vec![0, 1], template: None }]);
        let named = map(&["a", "b"], &[("solver", &["b"])]).shared();
        assert_eq!(named[0].policies, vec![1]);
    }

    #[test]
    fn players_one_policy_per_fixed_role() {
        const ROLES: [&str; 3] = ["rewriter", "reranker", "answerer"];
        let players = |m: RoleMap| m.players("search", &ROLES, &[0, 1, 2]);
        let err = |m: RoleMap| players(m).unwrap_err().to_string();
        assert_eq!(players(map(&["a"], &[])).unwrap(), vec![Some(0); 3]);
        let per_role = map(&["a", "b"], &[("rewriter", &["a"]), ("reranker", &["a"]), ("answerer", &["b"])]);
        assert_eq!(players(per_role).unwrap(), vec![Some(0), Some(0), Some(1)]);
        assert!(err(map(&["a", "b"], &[])).contains("[[roles]]"));
        assert!(err(map(&["a"], &[("solver", &[])])).contains("not \"solver\""));
        assert!(err(map(&["a"], &[("rewriter", &[]), ("answerer", &[])])).contains("no [[roles]] entry for reranker"));
        let unknown = map(&["a", "b"], &[("rewriter", &["c"]), ("reranker", &["a"]), ("answerer", &["b"])]);
        assert!(err(unknown).contains("no policy \"c\""));
        let idle = map(&["a", "b"], &[("rewriter", &["a"]), ("reranker", &["a"]), ("answerer", &["a"])]);
        assert!(err(idle).contains("\"b\" plays no role"));
        assert!(err(map(&["a"], &[("rewriter", &[]), ("rewriter", &[])])).contains("twice"));
    }

    #[test]
    fn a_role_not_needed_may_be_left_out() {
        let m = map(&["a", "b"], &[("plan", &["a"])]);
        let e = m.players("turn-wise", &["tool", "plan"], &[1]).unwrap_err().to_string();
        assert!(e.contains("\"b\" plays no role (only plan plays here)"), "{e}");
        let one = map(&["a"], &[("plan", &["a"])]);
        assert_eq!(one.players("turn-wise", &["tool", "plan"], &[1]).unwrap(), vec![None, Some(0)]);
        assert!(
            one.players("turn-wise", &["tool", "plan"], &[0, 1])
                .unwrap_err()
                .to_string()
                .contains("no [[roles]] entry for tool")
        );
    }
}
