//! FNV-1a: a hash that is the same on every platform, build and Rust version (the standard
//! library's `DefaultHasher` promises none of that). Cache keys and data splits use it, so a
//! cached model or a held-out instance never moves; [`mix_seed`] derives the rollouts' seeds
//! the same way.

use std::hash::Hasher;

pub struct StableHasher(u64);

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for StableHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The hash of `bytes` alone.
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = StableHasher::default();
    h.write(bytes);
    h.finish()
}

/// Independent seeds from parts (run seed, step, policy, chunk): each part folded in and
/// mixed with SplitMix64's finaliser. Like the hash, the same everywhere, so a seeded rollout
/// repeats on any machine.
pub fn mix_seed(parts: &[u64]) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for &p in parts {
        x ^= p.wrapping_add(0x9E37_79B9_7F4A_7C15).wrapping_add(x << 6).wrapping_add(x >> 2);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x = z ^ (z >> 31);
    }
    x
}

#[cfg(test)]
mod tests {
    #[test]
    fn it_is_fnv_1a() {
        // The published FNV-1a 64-bit test vectors.
        assert_eq!(super::hash_bytes(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(super::hash_bytes(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(super::hash_bytes(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
