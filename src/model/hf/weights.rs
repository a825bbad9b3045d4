//! Hugging Face safetensors weights ↔ the burn model, through burn-store's safetensors store.
//!
//! Loading checks every tensor of the checkpoint against the list `config.json` implies
//! ([`HfArch::expected_tensors`]) before any data is read: a missing, unknown or
//! shape-mismatched tensor (or an unsupported dtype, a truncated file, a shard the index names
//! but that does not hold the tensor) is an error naming the tensor, the file and both shapes.
//! Then the tensors are applied by path ([`Fill`]): linear weights transposed (the checkpoint's
//! `[out, in]` is burn's `[in, out]`), f16/bf16 widened to f32, a norm's `weight` is burn's
//! `gamma`. Saving goes the other way and writes the same Hugging Face key layout in f32.
//!
//! These are the rules of burn-store's PyTorch adapters, which this module used before: its
//! adapters transposed element by element through a `memcpy` call each and copied every tensor
//! three times, so a 135M model took 2.5–4 s to convert each way, and an iteration converted
//! one a dozen times (a seventh of its time). The tests check the bytes against burn-store's.

use super::arch::CausalLm;
use super::config::HfArch;
use crate::error::{Error, Result};
use burn::tensor::DType;
use burn::tensor::backend::Backend;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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

/// One tensor of a safetensors file as stored: dtype, shape (`[out, in]` for a linear weight)
/// and little-endian bytes.
struct Raw<'a> {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data: &'a [u8],
}

impl Raw<'_> {
    /// The values as f32 (f16 and bf16 widened exactly). Library routines, not loops of this
    /// crate: they run optimised in the dev profile too.
    fn values(&self) -> Vec<f32> {
        use half::slice::HalfFloatSliceExt;
        use safetensors::Dtype;
        match self.dtype {
            Dtype::F32 => bytemuck::pod_collect_to_vec(self.data),
            Dtype::BF16 => {
                let h: Vec<half::bf16> = bytemuck::pod_collect_to_vec(self.data);
                let mut out = vec![0f32; h.len()];
                h.convert_to_f32_slice(&mut out);
                out
            }
            // `check_tensors` admits F32, F16 and BF16 only.
            _ => {
                let h: Vec<half::f16> = bytemuck::pod_collect_to_vec(self.data);
                let mut out = vec![0f32; h.len()];
                h.convert_to_f32_slice(&mut out);
                out
            }
        }
    }
}

// Safetensors is little-endian; tensor bytes are the machine's.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "safetensors conversion assumes a little-endian machine"
);

/// Where a module visit is: the field names and the types of the structs holding them, as
/// burn's derived `Module` reports them.
#[derive(Default)]
struct ModulePath {
    names: Vec<String>,
    containers: Vec<String>,
}

impl ModulePath {
    fn enter(&mut self, name: &str, container: &str) {
        self.names.push(name.to_string());
        self.containers.push(container.to_string());
    }

    fn exit(&mut self) {
        self.names.pop();
        self.containers.pop();
    }

    /// The parameter's Hugging Face name (a norm's `gamma` is `weight`, `beta` is `bias`), and
    /// whether it is a linear weight (transposed between the layouts): burn-store's PyTorch
    /// adapters' rules, keyed on the innermost struct holding the parameter.
    fn hf_name(&self, dims: usize) -> (String, bool) {
        let module = self
            .containers
            .iter()
            .rev()
            .find(|c| c.starts_with("Struct:") || c.starts_with("Enum:"))
            .map(String::as_str)
            .unwrap_or("");
        let last = self.names.last().map(String::as_str).unwrap_or("");
        let mut names = self.names.clone();
        if module.ends_with("Norm") {
            match last {
                "gamma" => *names.last_mut().expect("a parameter has a name") = "weight".into(),
                "beta" => *names.last_mut().expect("a parameter has a name") = "bias".into(),
                _ => {}
            }
        }
        let linear = module == "Struct:Linear" && last == "weight" && dims == 2;
        (names.join("."), linear)
    }
}

/// Sets every parameter of a model from the tensors of its Hugging Face checkpoint.
struct Fill<'a> {
    tensors: &'a BTreeMap<String, Raw<'a>>,
    at: ModulePath,
    applied: usize,
}

impl<B: Backend> burn::module::ModuleMapper<B> for Fill<'_> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.at.enter(name, container_type);
    }

    fn exit_module(&mut self, _: &str, _: &str) {
        self.at.exit();
    }

    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<burn::Tensor<B, D>>,
    ) -> burn::module::Param<burn::Tensor<B, D>> {
        let (name, linear) = self.at.hf_name(D);
        // Not a tensor of the checkpoint (an adapter's): left as it is, and the caller's count
        // of applied tensors says so.
        let Some(raw) = self.tensors.get(&name) else {
            return param;
        };
        let (id, device) = (param.id, param.lazy_device());
        let data = burn::tensor::TensorData::new(raw.values(), raw.shape.clone());
        let mut tensor = burn::Tensor::<B, D>::from_data(data, &device);
        if linear {
            // `[out, in]` → `[in, out]`, made contiguous by the backend's tiled copy.
            tensor = burn::Tensor::from_data(tensor.transpose().into_data(), &device);
        }
        self.applied += 1;
        param.transform_for_load(tensor, id)
    }
}

/// The model of `arch` with the tensors of `found` (checked against it), every one applied.
fn build<B: Backend>(
    arch: &HfArch,
    found: &BTreeMap<String, Raw<'_>>,
    device: &B::Device,
) -> Result<CausalLm<B>> {
    let mut fill = Fill {
        tensors: found,
        at: ModulePath::default(),
        applied: 0,
    };
    let model = burn::module::Module::map(CausalLm::<B>::init(arch, device), &mut fill);
    let want = arch.expected_tensors().len();
    if fill.applied != want {
        return Err(Error::Model(format!(
            "{} of the {want} tensors of the model were loaded",
            fill.applied
        )));
    }
    Ok(model)
}

/// The tensors of one safetensors file in memory, by name.
fn raw_tensors<'a>(bytes: &'a [u8], what: &str, out: &mut BTreeMap<String, Raw<'a>>) -> Result<()> {
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| Error::Model(format!("{what}: {e}")))?;
    for (name, view) in st.tensors() {
        out.insert(
            name,
            Raw {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                data: view.data(),
            },
        );
    }
    Ok(())
}

/// `files` mapped into memory, read-only.
fn map_files(files: &[PathBuf]) -> Result<Vec<memmap2::Mmap>> {
    files
        .iter()
        .map(|file| {
            let handle = std::fs::File::open(file)
                .map_err(|e| Error::Model(format!("{}: {e}", file.display())))?;
            // SAFETY: read-only, and dropped before the caller returns; a file changed
            // underneath gives wrong values or an error, never unsafety in this process's
            // own memory (the map is only read).
            unsafe { memmap2::Mmap::map(&handle) }
                .map_err(|e| Error::Model(format!("{}: {e}", file.display())))
        })
        .collect()
}

/// The model of `arch` with the weights of `files` (checked with [`check_tensors`] first).
pub fn load<B: Backend>(
    arch: &HfArch,
    files: &[PathBuf],
    device: &B::Device,
) -> Result<CausalLm<B>> {
    check_tensors(arch, &read_headers(files)?)?;
    let maps = map_files(files)?;
    let mut found = BTreeMap::new();
    for (map, file) in maps.iter().zip(files) {
        raw_tensors(map, &file.display().to_string(), &mut found)?;
    }
    build(arch, &found, device)
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
    let mut found = BTreeMap::new();
    raw_tensors(bytes, what, &mut found)?;
    build(arch, &found, device)
}

/// A tensor for `safetensors::serialize`, its bytes made when they are written (one tensor's
/// worth of memory at a time beside the file being built).
struct Lazy<'a> {
    shape: Vec<usize>,
    len: usize,
    bytes: Box<dyn Fn() -> std::borrow::Cow<'a, [u8]> + 'a>,
}

impl<'a> safetensors::View for &Lazy<'a> {
    fn dtype(&self) -> safetensors::Dtype {
        safetensors::Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        (self.bytes)()
    }

    fn data_len(&self) -> usize {
        self.len
    }
}

/// f32 tensors as one safetensors file: the same bytes burn-store's store wrote (the same
/// `serialize`, one metadata key).
fn serialize(tensors: &[(String, Lazy<'_>)]) -> Result<Vec<u8>> {
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(tensors.iter().map(|(n, t)| (n.as_str(), t)), Some(meta))
        .map_err(|e| Error::Model(format!("saving safetensors: {e}")))
}

/// Collects a model's parameters with their Hugging Face names, as tensors to serialize.
struct Collect<'a, B: Backend> {
    at: ModulePath,
    out: Vec<(String, Lazy<'a>)>,
    error: Option<Error>,
    _backend: std::marker::PhantomData<B>,
}

impl<'a, B: Backend> burn::module::ModuleVisitor<B> for Collect<'a, B> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.at.enter(name, container_type);
    }

    fn exit_module(&mut self, _: &str, _: &str) {
        self.at.exit();
    }

    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<burn::Tensor<B, D>>) {
        let (name, linear) = self.at.hf_name(D);
        let tensor = param.val();
        if tensor.dtype() != DType::F32 {
            self.error.get_or_insert(Error::Model(format!(
                "saving safetensors: `{name}` is {:?}, not f32",
                tensor.dtype()
            )));
            return;
        }
        let tensor = if linear { tensor.transpose() } else { tensor };
        let shape = tensor.dims().to_vec();
        let len = 4 * shape.iter().product::<usize>();
        let bytes = Box::new(move || {
            // Contiguous in the Hugging Face layout (the backend's tiled copy for a linear
            // weight's transpose).
            std::borrow::Cow::Owned(tensor.clone().into_data().as_bytes().to_vec())
        });
        self.out.push((name, Lazy { shape, len, bytes }));
    }
}

/// The model's weights as one f32 safetensors file in the Hugging Face key layout.
pub fn to_safetensors<B: Backend>(model: &CausalLm<B>) -> Result<Vec<u8>> {
    let mut collect = Collect::<B> {
        at: ModulePath::default(),
        out: Vec::new(),
        error: None,
        _backend: std::marker::PhantomData,
    };
    burn::module::Module::visit(model, &mut collect);
    if let Some(e) = collect.error {
        return Err(e);
    }
    serialize(&collect.out)
}

/// The f32 checkpoint of the model in `files` without building it: the tensors `arch`
/// expects, widened to f32 — the same bytes as [`to_safetensors`] of [`load`] (a linear
/// weight is transposed on loading and back on saving; the tests check the bytes).
pub fn canonical(arch: &HfArch, files: &[PathBuf]) -> Result<Vec<u8>> {
    let headers = read_headers(files)?;
    check_tensors(arch, &headers)?;
    let maps = map_files(files)?;
    let mut found = BTreeMap::new();
    for (map, file) in maps.iter().zip(files) {
        raw_tensors(map, &file.display().to_string(), &mut found)?;
    }
    let tensors: Vec<(String, Lazy<'_>)> = arch
        .expected_tensors()
        .into_iter()
        .map(|(name, shape)| {
            let raw = &found[&name];
            (name, widened(raw, shape))
        })
        .collect();
    serialize(&tensors)
}

/// `raw` as an f32 tensor to serialize: its own bytes when it is f32.
fn widened<'a>(raw: &'a Raw<'a>, shape: Vec<usize>) -> Lazy<'a> {
    let len = 4 * shape.iter().product::<usize>();
    let bytes: Box<dyn Fn() -> std::borrow::Cow<'a, [u8]> + 'a> =
        if raw.dtype == safetensors::Dtype::F32 {
            Box::new(move || std::borrow::Cow::Borrowed(raw.data))
        } else {
            Box::new(move || std::borrow::Cow::Owned(bytemuck::cast_slice(&raw.values()).to_vec()))
        };
    Lazy { shape, len, bytes }
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

/// burn-store's safetensors store with its PyTorch adapters: how this module loaded and saved
/// before, kept as the reference the tests compare bytes with.
#[cfg(test)]
mod reference {
    use super::*;
    use burn_store::{
        BurnToPyTorchAdapter, ModuleAdapter, ModuleSnapshot, PyTorchToBurnAdapter,
        SafetensorsStore, TensorSnapshot,
    };
    use std::rc::Rc;

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
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARCHS: [&str; 4] = [
        r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 40, "hidden_size": 16,
            "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "tie_word_embeddings": true}"#,
        r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 40, "hidden_size": 16,
            "intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "tie_word_embeddings": false}"#,
        r#"{"architectures": ["Qwen2ForCausalLM"], "vocab_size": 40, "hidden_size": 16,
            "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "tie_word_embeddings": false}"#,
        r#"{"architectures": ["Qwen3ForCausalLM"], "vocab_size": 40, "hidden_size": 16,
            "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": true}"#,
    ];

    /// A checkpoint of `arch` with distinct values in `dtype` (`F32`, `BF16`, `F16`), plus a
    /// tensor the model does not use.
    fn checkpoint(arch: &HfArch, dtype: &'static str) -> Vec<u8> {
        let mut k = 0u32;
        let mut next = || {
            k += 1;
            ((k.wrapping_mul(2654435761) >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.7
        };
        let mut tensors: Vec<RawTensor> = arch
            .expected_tensors()
            .into_iter()
            .map(|(name, shape)| {
                let n: usize = shape.iter().product();
                let data: Vec<u8> = (0..n)
                    .flat_map(|_| {
                        let x = next();
                        match dtype {
                            "F32" => x.to_le_bytes().to_vec(),
                            "BF16" => bf16_bits(x).to_le_bytes().to_vec(),
                            _ => half::f16::from_f32(x).to_le_bytes().to_vec(),
                        }
                    })
                    .collect();
                (name, dtype, shape, data)
            })
            .collect();
        tensors.reverse();
        tensors.push((
            "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
            "F32",
            vec![2],
            [1f32, 0.5].iter().flat_map(|x| x.to_le_bytes()).collect(),
        ));
        write_safetensors(&tensors, &[])
    }

    fn differ(a: &[u8], b: &[u8]) -> String {
        let at = a.iter().zip(b).position(|(x, y)| x != y);
        format!(
            "{} vs {} bytes, first difference at {at:?}",
            a.len(),
            b.len()
        )
    }

    /// Loading, saving and the canonical checkpoint give burn-store's bytes, bit for bit, for
    /// Llama (tied and untied), Qwen2 (q/k/v biases) and Qwen3 (q/k norms), from f32, bf16
    /// and f16 files; and a model carrying adapters saves as burn-store saved it.
    #[test]
    fn bytes_equal_burn_stores() {
        let dir = tempfile::tempdir().unwrap();
        let dev = Default::default();
        for (i, json) in ARCHS.iter().enumerate() {
            let arch = HfArch::from_json(json).unwrap();
            for dtype in ["F32", "BF16", "F16"] {
                let what = format!("{} #{i} {dtype}", arch.architecture.hf_name());
                let file = dir.path().join(format!("{i}-{dtype}.safetensors"));
                let ck = checkpoint(&arch, dtype);
                std::fs::write(&file, &ck).unwrap();
                let files = vec![file];
                let want = reference::to_safetensors(
                    &reference::load::<crate::model::Cpu>(&arch, &files, &dev).unwrap(),
                )
                .unwrap();
                let model = load::<crate::model::Cpu>(&arch, &files, &dev).unwrap();
                let got = to_safetensors(&model).unwrap();
                assert!(got == want, "{what}: load + save: {}", differ(&got, &want));
                let got = canonical(&arch, &files).unwrap();
                assert!(got == want, "{what}: canonical: {}", differ(&got, &want));
                let ours = load_bytes::<crate::model::Cpu>(&arch, &ck, "ck", &dev).unwrap();
                let theirs = reference::load_bytes::<crate::model::Cpu>(&arch, &ck, "ck", &dev);
                let got = reference::to_safetensors(&ours).unwrap();
                let want = reference::to_safetensors(&theirs.unwrap()).unwrap();
                assert!(got == want, "{what}: load_bytes: {}", differ(&got, &want));
            }
            let spec = super::super::adapter::LoraSpec {
                rank: 2,
                alpha: 4.0,
                targets: vec!["q_proj".into(), "v_proj".into()],
                layers: 0,
            };
            let file = dir.path().join(format!("{i}-F32.safetensors"));
            let base = load::<crate::model::Cpu>(&arch, &[file], &dev).unwrap();
            let with = super::super::lora::attach_fresh(base, &spec, 3, &dev);
            let (got, want) = (
                to_safetensors(&with).unwrap(),
                reference::to_safetensors(&with).unwrap(),
            );
            assert!(got == want, "#{i} with adapters: {}", differ(&got, &want));
        }
    }

    #[test]
    fn a_missing_tensor_is_named() {
        let arch = HfArch::from_json(ARCHS[2]).unwrap();
        let full = checkpoint(&arch, "F32");
        let st = safetensors::SafeTensors::deserialize(&full).unwrap();
        let kept: Vec<RawTensor> = st
            .tensors()
            .into_iter()
            .filter(|(n, _)| n != "model.layers.1.self_attn.k_proj.bias")
            .map(|(n, v)| (n, "F32", v.shape().to_vec(), v.data().to_vec()))
            .collect();
        let bytes = write_safetensors(&kept, &[]);
        let err = load_bytes::<crate::model::Cpu>(&arch, &bytes, "ck", &Default::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("model.layers.1.self_attn.k_proj.bias"),
            "{err}"
        );
    }
}
