//! Group statistics and GRPO advantages (docs/algorithms.md §1.1).
//!
//! A *group* is the set of responses to one prompt. GRPO normalises each reward by its group's
//! mean and unbiased standard deviation (divisor N−1, as `torch.std`), plus ε = 1e-6; a group of
//! one response has mean 0 and std 1, as in verl.

/// Arithmetic mean; 0 for an empty slice.
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() { 0.0 } else { xs.iter().sum::<f64>() / xs.len() as f64 }
}

/// Unbiased (Bessel-corrected) standard deviation; 0 for fewer than two values.
pub fn unbiased_std(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let m = mean(xs);
    (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (xs.len() - 1) as f64).sqrt()
}

/// The ε added to the group standard deviation.
pub const ADV_EPSILON: f64 = 1e-6;

/// GRPO advantages of one group: `(r − mean) / (std + ε)`; a singleton group gets `r`.
pub fn grpo_group_advantages(rewards: &[f64], epsilon: f64, normalize_by_std: bool) -> Vec<f64> {
    if rewards.len() == 1 {
        return rewards.to_vec();
    }
    let m = mean(rewards);
    let denom = if normalize_by_std { unbiased_std(rewards) + epsilon } else { 1.0 };
    rewards.iter().map(|r| (r - m) / denom).collect()
}

/// GRPO advantages for responses labelled with their group: same order as `rewards`.
pub fn grpo_advantages(rewards: &[f64], groups: &[usize], epsilon: f64, normalize_by_std: bool) -> Vec<f64> {
    assert_eq!(rewards.len(), groups.len(), "one group label per reward");
    let mut out = vec![0.0; rewards.len()];
    for (_, members) in group_members(groups) {
        let rs: Vec<f64> = members.iter().map(|&i| rewards[i]).collect();
        for (&i, a) in members.iter().zip(grpo_group_advantages(&rs, epsilon, normalize_by_std)) {
            out[i] = a;
        }
    }
    out
}

/// Indices of each group's members, groups in order of first appearance.
pub fn group_members(groups: &[usize]) -> Vec<(usize, Vec<usize>)> {
    let mut order: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for (i, &g) in groups.iter().enumerate() {
        let slot = *index.entry(g).or_insert_with(|| {
            order.push((g, Vec::new()));
            order.len() - 1
        });
        order[slot].1.push(i);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unbiased_std_matches_torch() {
        // torch.tensor([1.,0,1,1,0,0,1,0]).std() = 0.5345224838248488
        let s = unbiased_std(&[1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]);
        assert!((s - 0.534_522_483_824_848_8).abs() < 1e-15);
        assert_eq!(unbiased_std(&[3.0]), 0.0);
    }

    #[test]
    fn grpo_normalises_per_group_and_keeps_singletons() {
        let a = grpo_advantages(&[1.0, 0.0, 0.5, 1.0], &[7, 7, 9, 7], ADV_EPSILON, true);
        let std = unbiased_std(&[1.0, 0.0, 1.0]);
        assert!((a[0] - (1.0 - 2.0 / 3.0) / (std + ADV_EPSILON)).abs() < 1e-12);
        assert!((a[1] - (0.0 - 2.0 / 3.0) / (std + ADV_EPSILON)).abs() < 1e-12);
        assert_eq!(a[2], 0.5); // singleton: mean 0, std 1
        // Uniform rewards: all zero.
        assert!(grpo_group_advantages(&[1.0, 1.0, 1.0], ADV_EPSILON, true).iter().all(|&x| x == 0.0));
    }
}
