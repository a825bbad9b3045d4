//! Ground floor: the primitives every deterministic computation shares. Nothing here imports
//! anything else of the crate.
//!
//! - [`derive_seed`]: a stable seed from a root seed and a path of labels.
//! - [`Rng`]: the seeded generator every environment, model and stage draws from.
//! - [`canonical`]: canonical JSON (sorted keys, no whitespace), for hashes and task ids.

/// A stable 64-bit seed from a run seed and a path of labels (iter, stage, task, rollout, ...):
/// the first 8 bytes of blake3 over the parts, length-prefixed.
pub fn derive_seed(root: u64, parts: &[&str]) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&root.to_le_bytes());
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().expect("8 bytes"))
}

/// SplitMix64: small, fast, and fully determined by its seed.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [lo, hi].
    pub fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next_u64() % u64::from(hi - lo + 1)) as u32
    }
}

/// Serialize a JSON value with object keys sorted and no insignificant whitespace.
pub fn canonical(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Object(m) => {
            let mut keys: Vec<_> = m.keys().collect();
            keys.sort();
            let inner: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", serde_json::to_string(k).unwrap(), canonical(&m[k])))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        serde_json::Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_stable_and_distinct() {
        assert_eq!(
            derive_seed(1, &["0", "rollout"]),
            derive_seed(1, &["0", "rollout"])
        );
        assert_ne!(
            derive_seed(1, &["0", "rollout"]),
            derive_seed(2, &["0", "rollout"])
        );
        assert_ne!(
            derive_seed(1, &["0r", "ollout"]),
            derive_seed(1, &["0", "rollout"])
        );
    }

    #[test]
    fn canonical_sorts_keys() {
        let v = serde_json::json!({"b": [1, {"d": 1, "c": 2}], "a": "x"});
        assert_eq!(canonical(&v), r#"{"a":"x","b":[1,{"c":2,"d":1}]}"#);
    }
}
