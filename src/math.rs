//! Small numeric helpers for the CPU hot loops (sampling, fused log-softmax).

pub use hacpo_kernels::fast_exp;

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
        assert!(fast_exp(f32::NAN).is_nan());
        // The low end of the range, where the power of two is 2⁻¹²⁶; the high end overflows.
        let low = fast_exp(-87.3);
        assert!(((low - (-87.3f32).exp()) / low).abs() < 1e-6, "exp(-87.3) = {low}");
        assert_eq!(fast_exp(f32::INFINITY), f32::INFINITY);
    }
}
