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
    }
}
