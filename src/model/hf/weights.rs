//! Hugging Face safetensors weights ↔ the burn model, through burn-store's safetensors store.
//!
//! Loading checks every tensor of the checkpoint against the list `config.json` implies
//! ([`HfArch::expected_tensors`]) before any data is read: a missing, unknown or
//! shape-mismatched tensor (or an unsupported dtype, a truncated file, a shard the index names
//! but that does not hold the tensor) is an error naming the tensor, the file and both shapes.
//! Then burn-store applies the tensors by path with two adapters (linear weights transposed,
//! f16/bf16 widened to f32) and one key remapping (the checkpoint's RMSNorm `weight` is burn's
//! `gamma`). Saving goes the other way and writes the same Hugging Face key layout in f32.

use super::arch::CausalLm;
use super::config::HfArch;
use crate::error::{Error, Result};
use burn::tensor::DType;
use burn::tensor::backend::Backend;
use burn_store::{
    BurnToPyTorchAdapter, ModuleAdapter, ModuleSnapshot, PyTorchToBurnAdapter, SafetensorsStore,
    TensorSnapshot,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Tensors a checkpoint may hold that the model does not use.
fn ignorable(name: &str, arch: &HfArch) -> bool {
    name.ends_with("rotary_emb.inv_freq") || (arch.tied && name == "lm_head.weight")
}

/// The weight files of a model directory, in a fixed order: `model.safetensors`, or the shards
/// `model.safetensors.index.json` names (sorted).
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index)
            .map_err(|e| Error::Model(format!("{}: {e}", index.display())))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::Model(format!("{}: line {}: {e}", index.display(), e.line())))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| {
                Error::Model(format!(
                    "{}: key `weight_map`: missing or not an object",
                    index.display()
                ))
            })?;
        let mut files: Vec<String> = Vec::new();
        for (tensor, file) in map {
            let file = file.as_str().ok_or_else(|| {
                Error::Model(format!(
                    "{}: key `weight_map.{tensor}`: not a file name",
                    index.display()
                ))
            })?;
            if file.contains('/') || file.contains("..") {
                return Err(Error::Model(format!(
                    "{}: key `weight_map.{tensor}`: {file:?} is not a file of the directory",
                    index.display()
                )));
            }
            files.push(file.to_string());
        }
        files.sort();
        files.dedup();
        Ok(files.into_iter().map(|f| dir.join(f)).collect())
    } else if single.exists() {
        Ok(vec![single])
    } else {
        Err(Error::Model(format!(
            "{}: no model.safetensors or model.safetensors.index.json",
            dir.display()
        )))
    }
}

/// One tensor as a checkpoint's header declares it.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub file: PathBuf,
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// Read the headers of `files` (no tensor data): name → info.
pub fn read_headers(files: &[PathBuf]) -> Result<BTreeMap<String, TensorInfo>> {
    let mut out = BTreeMap::new();
    for file in files {
        let handle = std::fs::File::open(file)
            .map_err(|e| Error::Model(format!("{}: {e}", file.display())))?;
        // SAFETY: the map is read-only and dropped before this function returns; a file changed
        // underneath would give wrong header values, which the checks below then report.
        let bytes = unsafe { memmap2::Mmap::map(&handle) }
            .map_err(|e| Error::Model(format!("{}: {e}", file.display())))?;
        header_of(&bytes, file, &mut out)?;
    }
    Ok(out)
}

/// The tensors of a safetensors checkpoint held in memory (one in the store).
pub fn check_bytes(bytes: &[u8], out: &mut BTreeMap<String, TensorInfo>) -> Result<()> {
    header_of(bytes, Path::new("checkpoint"), out)
}

/// Add the tensors of one safetensors file (`bytes`, read from `file`) to `out`.
fn header_of(bytes: &[u8], file: &Path, out: &mut BTreeMap<String, TensorInfo>) -> Result<()> {
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| {
        Error::Model(format!(
            "{}: not a readable safetensors file: {e}",
            file.display()
        ))
    })?;
    // `read_metadata` checks the offsets against the header; check them against the file.
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| {
        Error::Model(format!(
            "{}: truncated or corrupt safetensors file ({} bytes): {e}",
            file.display(),
            bytes.len()
        ))
    })?;
    for (name, view) in st.tensors() {
        let info = meta.info(&name).expect("a listed tensor has header info");
        let dtype = format!("{:?}", info.dtype);
        let entry = TensorInfo {
            file: file.to_path_buf(),
            dtype,
            shape: view.shape().to_vec(),
        };
        if out.insert(name.clone(), entry).is_some() {
            return Err(Error::Model(format!(
                "{}: tensor `{name}` is also in another shard",
                file.display()
            )));
        }
    }
    Ok(())
}

/// Check a checkpoint's tensors against the model `config.json` describes.
pub fn check_tensors(arch: &HfArch, found: &BTreeMap<String, TensorInfo>) -> Result<()> {
    let expected = arch.expected_tensors();
    for (name, shape) in &expected {
        let Some(info) = found.get(name) else {
            return Err(Error::Model(format!(
                "tensor `{name}` (shape {shape:?} from config.json) is missing from the checkpoint"
            )));
        };
        if &info.shape != shape {
            return Err(Error::Model(format!(
                "tensor `{name}` in {}: shape {:?}, but config.json implies {shape:?}",
                info.file.display(),
                info.shape
            )));
        }
        if !matches!(info.dtype.as_str(), "F32" | "F16" | "BF16") {
            return Err(Error::Model(format!(
                "tensor `{name}` in {}: dtype {} is not supported (F32, F16, BF16)",
                info.file.display(),
                info.dtype
            )));
        }
    }
    let known: std::collections::HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    if let Some((name, info)) = found
        .iter()
        .find(|(n, _)| !known.contains(n.as_str()) && !ignorable(n, arch))
    {
        return Err(Error::Model(format!(
            "tensor `{name}` in {} (shape {:?}) is not part of a {} with this config.json",
            info.file.display(),
            info.shape,
            arch.architecture.hf_name()
        )));
    }
    Ok(())
}

/// Widens f16 / bf16 tensors to f32 as burn-store reads them.
#[derive(Clone)]
struct WidenToF32;

impl ModuleAdapter for WidenToF32 {
    fn adapt(&self, s: &TensorSnapshot) -> TensorSnapshot {
        if s.dtype == DType::F32 {
            return s.clone();
        }
        let data = s.clone_data_fn();
        TensorSnapshot::from_closure(
            Rc::new(move || data().map(|d| d.convert::<f32>())),
            DType::F32,
            s.shape.clone(),
            s.path_stack.clone().unwrap_or_default(),
            s.container_stack.clone().unwrap_or_default(),
            s.tensor_id.unwrap_or_default(),
        )
    }

    fn clone_box(&self) -> Box<dyn ModuleAdapter> {
        Box::new(self.clone())
    }
}

/// Apply the tensors of one safetensors store (a file or bytes, named `what` in errors) to the
/// model: linear weights transposed, f16/bf16 widened, norm `weight` → `gamma`. Returns how
/// many tensors it applied.
fn apply<B: Backend>(
    model: &mut CausalLm<B>,
    store: SafetensorsStore,
    what: &str,
) -> Result<usize> {
    let mut store = store
        .with_from_adapter(PyTorchToBurnAdapter.chain(WidenToF32))
        .with_key_remapping(r"norm\.weight$", "norm.gamma")
        .allow_partial(true)
        .validate(false);
    let result = model
        .load_from(&mut store)
        .map_err(|e| Error::Model(format!("{what}: {e}")))?;
    if let Some(e) = result.errors.first() {
        return Err(Error::Model(format!("{what}: {e:?}")));
    }
    Ok(result.applied.len())
}

/// The model of `arch` with the weights of `files` (checked with [`check_tensors`] first).
pub fn load<B: Backend>(
    arch: &HfArch,
    files: &[PathBuf],
    device: &B::Device,
) -> Result<CausalLm<B>> {
    let headers = read_headers(files)?;
    check_tensors(arch, &headers)?;
    let mut model = CausalLm::<B>::init(arch, device);
    let mut applied = 0usize;
    for file in files {
        let what = file.display().to_string();
        applied += apply(&mut model, SafetensorsStore::from_file(file), &what)?;
    }
    let want = arch.expected_tensors().len();
    if applied != want {
        return Err(Error::Model(format!(
            "{} of the {want} tensors of the model were loaded",
            applied
        )));
    }
    Ok(model)
}

/// The model of `arch` from one safetensors file in memory (a checkpoint in the store, named
/// `what` in errors).
pub fn load_bytes<B: Backend>(
    arch: &HfArch,
    bytes: &[u8],
    what: &str,
    device: &B::Device,
) -> Result<CausalLm<B>> {
    let mut headers = BTreeMap::new();
    header_of(bytes, Path::new(what), &mut headers)?;
    check_tensors(arch, &headers)?;
    let mut model = CausalLm::<B>::init(arch, device);
    apply(
        &mut model,
        SafetensorsStore::from_bytes(Some(bytes.to_vec())),
        what,
    )?;
    Ok(model)
}

/// The model's weights as one f32 safetensors file in the Hugging Face key layout.
pub fn to_safetensors<B: Backend>(model: &CausalLm<B>) -> Result<Vec<u8>> {
    let mut store = SafetensorsStore::from_bytes(None)
        .with_to_adapter(BurnToPyTorchAdapter)
        .with_key_remapping(r"norm\.gamma$", "norm.weight")
        // One metadata key: burn-store's defaults sit in a HashMap, whose order (and so the
        // file's bytes) would change from run to run.
        .clear_metadata()
        .metadata("format", "pt");
    model
        .save_into(&mut store)
        .map_err(|e| Error::Model(format!("saving safetensors: {e}")))?;
    store
        .get_bytes()
        .map_err(|e| Error::Model(format!("saving safetensors: {e}")))
}

/// The blake3 digest of a checkpoint's weights: the weight files' bytes, in [`weight_files`]
/// order (hex).
pub fn digest(files: &[PathBuf]) -> Result<String> {
    let mut h = blake3::Hasher::new();
    for f in files {
        let mut file =
            std::fs::File::open(f).map_err(|e| Error::Model(format!("{}: {e}", f.display())))?;
        std::io::copy(&mut file, &mut h)
            .map_err(|e| Error::Model(format!("{}: {e}", f.display())))?;
    }
    Ok(h.finalize().to_hex().to_string())
}

/// One tensor to write: name, safetensors dtype (`F32`, `BF16`), shape, little-endian bytes.
pub type RawTensor = (String, &'static str, Vec<usize>, Vec<u8>);

/// A safetensors file in a fixed byte layout: the metadata pairs, then the tensors in the
/// order given (the header's keys in that order too), the header padded to 8 bytes.
pub fn write_safetensors(tensors: &[RawTensor], metadata: &[(&str, &str)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let meta: serde_json::Map<String, serde_json::Value> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    header.insert("__metadata__".into(), meta.into());
    let mut at = 0usize;
    for (name, dtype, shape, data) in tensors {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + data.len()]}),
        );
        at += data.len();
    }
    // serde_json keeps insertion order (`preserve_order`): a fixed header for fixed tensors.
    let mut text = serde_json::to_string(&header).expect("a JSON map serializes");
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut out = Vec::with_capacity(8 + text.len() + at);
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    out
}

/// An f32 value rounded to bf16 (to nearest, ties to even; NaN stays NaN).
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// An f32 safetensors checkpoint ([`to_safetensors`]) with every F32 tensor rounded to bf16
/// (`update.checkpoint_dtype = "bf16"`): half the bytes; loading widens it back to f32.
pub fn to_bf16(bytes: &[u8]) -> Result<Vec<u8>> {
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| Error::Model(format!("checkpoint: {e}")))?;
    let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    names.sort();
    let mut out: Vec<RawTensor> = Vec::with_capacity(names.len());
    for name in names {
        let v = st
            .tensor(&name)
            .map_err(|e| Error::Model(format!("checkpoint: `{name}`: {e}")))?;
        let shape = v.shape().to_vec();
        if v.dtype() == safetensors::Dtype::F32 {
            let data: Vec<u8> = v
                .data()
                .chunks_exact(4)
                .flat_map(|c| bf16_bits(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes())
                .collect();
            out.push((name, "BF16", shape, data));
        } else {
            return Err(Error::Model(format!(
                "checkpoint: `{name}` is {:?}, expected F32",
                v.dtype()
            )));
        }
    }
    Ok(write_safetensors(&out, &[("format", "pt")]))
}

#[cfg(test)]
mod bf16_tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_round_trips() {
        // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
        assert_eq!(bf16_bits(1.0 + 2f32.powi(-8)), 0x3f80);
        // Just above halfway rounds up.
        assert_eq!(bf16_bits(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 0x3f81);
        assert_eq!(bf16_bits(-2.0), 0xc000);
        assert!(f32::from_bits(u32::from(bf16_bits(f32::NAN)) << 16).is_nan());
        let t: Vec<RawTensor> = vec![(
            "w".into(),
            "F32",
            vec![2],
            [1.5f32, -0.3]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        )];
        let b = to_bf16(&write_safetensors(&t, &[("format", "pt")])).unwrap();
        let st = safetensors::SafeTensors::deserialize(&b).unwrap();
        let w = st.tensor("w").unwrap();
        assert_eq!(w.dtype(), safetensors::Dtype::BF16);
        let back: Vec<f32> = w
            .data()
            .chunks_exact(2)
            .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
            .collect();
        assert_eq!(back[0], 1.5);
        assert!((back[1] + 0.3).abs() < 0.3 / 256.0, "{}", back[1]);
    }
}
