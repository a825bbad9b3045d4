//! Checkpoint bytes: `RLAPIPE-CKPT 1\n`, an 8-byte little-endian header length, a JSON header
//! (role, model shape, parameter names and shapes in [`ModelConfig::param_shapes`] order), then
//! every parameter's f32 values, little-endian, row-major. Equal weights → equal bytes.

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use super::transformer::{ModelConfig, Transformer, float_tensor};
use crate::determinism::Rng;
use crate::error::{Error, Result};

const MAGIC: &[u8] = b"RLAPIPE-CKPT 1\n";

/// A model's weights on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub role: String,
    pub config: ModelConfig,
    /// One vector per parameter, in checkpoint order.
    pub params: Vec<Vec<f32>>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    role: String,
    model: ModelConfig,
    params: Vec<(String, [usize; 2])>,
}

impl Checkpoint {
    /// Seeded initialization: N(0, 0.02) weights (residual projections scaled by 1/√(2·layers)),
    /// RMSNorm gains 1.
    pub fn init(role: &str, cfg: &ModelConfig, seed: u64) -> Checkpoint {
        let mut rng = Rng::new(seed);
        let mut normal = move || {
            // Box–Muller on the run's own generator: no global RNG state, same on every machine.
            let u1 = rng.unit().max(1e-12);
            let u2 = rng.unit();
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        };
        let resid = 0.02 / (2.0 * cfg.layers as f32).sqrt();
        let params = cfg
            .param_shapes()
            .into_iter()
            .map(|(name, [r, c])| {
                let n = r * c;
                if name.contains("norm") {
                    vec![1.0; n]
                } else {
                    let std = if name.ends_with(".wo") || name.ends_with(".w2") {
                        resid
                    } else {
                        0.02
                    };
                    (0..n).map(|_| normal() * std).collect()
                }
            })
            .collect();
        Checkpoint {
            role: role.to_string(),
            config: cfg.clone(),
            params,
        }
    }

    pub fn encode(&self) -> bytes::Bytes {
        let header = Header {
            role: self.role.clone(),
            model: self.config.clone(),
            params: self.config.param_shapes(),
        };
        let json = serde_json::to_vec(&header).expect("header serializes");
        let floats: usize = self.params.iter().map(Vec::len).sum();
        let mut out = Vec::with_capacity(MAGIC.len() + 8 + json.len() + 4 * floats);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(json.len() as u64).to_le_bytes());
        out.extend_from_slice(&json);
        for p in &self.params {
            for x in p {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        bytes::Bytes::from(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Checkpoint> {
        let bad = |m: &str| Error::Model(format!("not a usable rla-pipe checkpoint: {m}"));
        let rest = bytes.strip_prefix(MAGIC).ok_or_else(|| bad("bad magic"))?;
        if rest.len() < 8 {
            return Err(bad("truncated header"));
        }
        let hlen = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes")) as usize;
        let rest = &rest[8..];
        if rest.len() < hlen {
            return Err(bad("truncated header"));
        }
        let header: Header =
            serde_json::from_slice(&rest[..hlen]).map_err(|e| bad(&format!("header: {e}")))?;
        if header.params != header.model.param_shapes() {
            return Err(bad("parameter list does not match the model shape"));
        }
        let mut data = &rest[hlen..];
        let mut params = Vec::with_capacity(header.params.len());
        for (name, [r, c]) in &header.params {
            let n = r * c * 4;
            if data.len() < n {
                return Err(bad(&format!("truncated at parameter {name}")));
            }
            params.push(
                data[..n]
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                    .collect(),
            );
            data = &data[n..];
        }
        if !data.is_empty() {
            return Err(bad("trailing bytes"));
        }
        Ok(Checkpoint {
            role: header.role,
            config: header.model,
            params,
        })
    }

    /// The model on a device.
    pub fn to_model<B: Backend>(&self, device: &B::Device) -> Transformer<B> {
        let mut it = self.params.iter();
        Transformer::build(&self.config, |_, shape| {
            float_tensor(
                it.next().expect("one vector per parameter").clone(),
                shape,
                device,
            )
        })
    }

    /// The weights of a model.
    pub fn from_model<B: Backend>(
        role: &str,
        cfg: &ModelConfig,
        model: &Transformer<B>,
    ) -> Checkpoint {
        Checkpoint {
            role: role.to_string(),
            config: cfg.clone(),
            params: model
                .params()
                .iter()
                .map(|p| {
                    p.val()
                        .into_data()
                        .convert::<f32>()
                        .into_vec::<f32>()
                        .expect("f32 parameter")
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Cpu;

    fn cfg() -> ModelConfig {
        ModelConfig {
            vocab: 11,
            d_model: 8,
            layers: 2,
            heads: 2,
            context: 16,
        }
    }

    #[test]
    fn round_trip_through_bytes_and_a_model() {
        let ck = Checkpoint::init("policy", &cfg(), 3);
        assert_eq!(ck, Checkpoint::init("policy", &cfg(), 3));
        assert_ne!(ck, Checkpoint::init("policy", &cfg(), 4));
        let bytes = ck.encode();
        assert_eq!(Checkpoint::decode(&bytes).unwrap(), ck);
        let model = ck.to_model::<Cpu>(&Default::default());
        let back = Checkpoint::from_model("policy", &cfg(), &model);
        assert_eq!(back.encode(), bytes);
    }

    #[test]
    fn corrupt_bytes_are_errors() {
        let bytes = Checkpoint::init("rm", &cfg(), 1).encode();
        for broken in [&bytes[..10], &bytes[..40], &bytes[..bytes.len() - 1]] {
            let e = Checkpoint::decode(broken).unwrap_err().to_string();
            assert!(e.contains("checkpoint"), "{e}");
        }
        let mut more = bytes.to_vec();
        more.push(0);
        assert!(Checkpoint::decode(&more).is_err());
    }
}
