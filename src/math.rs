//! Small numeric helpers for the CPU hot loops (sampling, fused log-softmax).

/// `exp(x)` for f32, branch-free so loops over slices auto-vectorise (libm's `expf` does not,
/// and it was 9% of a training step). Cody–Waite range reduction and a degree-7 polynomial:
/// relative error below 2e-7 on [-87, 88]; inputs below −87.3 give 0 like `expf`'s underflow.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let underflow = x < -87.3;
    let x = x.clamp(-87.3, 88.7);
    // Round to nearest with the 1.5·2²³ trick: `f32::round` is a libm call on baseline
    // x86-64 and would stop the loop from vectorising.
    const ROUND: f32 = 12_582_912.0;
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    // e^r on |r| ≤ ln2/2 (the degree-7 Taylor remainder is below 1e-8 there).
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // n ∈ [−126, 128], so the add never overflows; a checked add (debug builds) would keep
    // the loops that call this from vectorising.
    let scale = f32::from_bits(((n as i32).wrapping_add(127) as u32) << 23);
    if underflow { 0.0 } else { p * scale }
}

#[cfg(test)]
mod tests {
    use super::fast_exp;

    #[test]
    fn fast_exp_is_accurate() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (fast_exp(x), x.exp());
            assert!(((got - want) / want).abs() < 2e-7, "exp({x}) = {got}, want {want}");
            x += 0.0137;
        }
        assert_eq!(fast_exp(-100.0), 0.0);
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(0.0), 1.0);
    }
}
