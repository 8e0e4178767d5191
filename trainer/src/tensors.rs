//! Reading and writing safetensors files of f32 tensors (and int64 counters) without libtorch.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::{Error, Result};

/// A dense f32 tensor held in Rust: a shape and its row-major values.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values, row-major.
    pub values: Vec<f32>,
}

impl HostTensor {
    /// A tensor from its shape and values.
    ///
    /// # Panics
    /// When the number of values is not the product of the shape.
    pub fn new(shape: impl Into<Vec<usize>>, values: impl Into<Vec<f32>>) -> Self {
        let (shape, values) = (shape.into(), values.into());
        assert_eq!(shape.iter().product::<usize>(), values.len(), "shape {shape:?} does not hold {} values", values.len());
        HostTensor { shape, values }
    }

    /// A 1-D tensor.
    pub fn vector(values: impl Into<Vec<f32>>) -> Self {
        let values = values.into();
        HostTensor { shape: vec![values.len()], values }
    }
}

/// Serialises named f32 tensors in the safetensors format, with no `__metadata__` header (as
/// safetensors' Python writer leaves it when not given any).
///
/// # Errors
/// [`Error::SafeTensors`] (naming `path`, used only for the message) when a tensor is invalid.
pub fn to_safetensors_bytes<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a HostTensor)>, path: &Path) -> Result<Vec<u8>> {
    serialize(
        tensors.into_iter().map(|(k, t)| (k, Dtype::F32, t.shape.clone(), t.values.iter().flat_map(|v| v.to_le_bytes()).collect())),
        path,
    )
}

/// A tensor as a file holds it: f32 values, or the int64 of a counter (BatchNorm's
/// `num_batches_tracked`), kept exact.
#[cfg(feature = "torch")]
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Stored {
    F32(HostTensor),
    I64 { shape: Vec<usize>, values: Vec<i64> },
}

#[cfg(feature = "torch")]
impl Stored {
    pub(crate) fn shape(&self) -> &[usize] {
        match self {
            Stored::F32(t) => &t.shape,
            Stored::I64 { shape, .. } => shape,
        }
    }
}

/// Writes named tensors, each in its own dtype, to a safetensors file (no `__metadata__`).
///
/// # Errors
/// [`Error::Io`] or [`Error::SafeTensors`].
#[cfg(feature = "torch")]
pub(crate) fn write_stored<'a>(path: &Path, tensors: impl IntoIterator<Item = (&'a str, &'a Stored)>) -> Result<()> {
    let raw = tensors.into_iter().map(|(k, t)| match t {
        Stored::F32(t) => (k, Dtype::F32, t.shape.clone(), t.values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        Stored::I64 { shape, values } => (k, Dtype::I64, shape.clone(), values.iter().flat_map(|v| v.to_le_bytes()).collect()),
    });
    let bytes = serialize(raw, path)?;
    std::fs::write(path, bytes).map_err(Error::io(path))
}

/// Reads a safetensors file keeping int64 tensors exact; every other dtype is read as
/// [`from_safetensors_bytes`] reads it.
///
/// # Errors
/// As [`read_safetensors`].
#[cfg(feature = "torch")]
pub(crate) fn read_stored(path: &Path) -> Result<BTreeMap<String, Stored>> {
    let bytes = std::fs::read(path).map_err(Error::io(path))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|source| Error::SafeTensors { path: path.into(), source })?;
    let mut out = BTreeMap::new();
    for (name, view) in st.iter() {
        let stored = match view.dtype() {
            Dtype::I64 => Stored::I64 {
                shape: view.shape().to_vec(),
                values: view.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect(),
            },
            dtype => Stored::F32(HostTensor { shape: view.shape().to_vec(), values: to_f32(dtype, name, view.data(), path)? }),
        };
        out.insert(name.to_string(), stored);
    }
    Ok(out)
}

/// Tensors of (name, dtype, shape, little-endian bytes) in the safetensors format.
fn serialize<'a>(tensors: impl Iterator<Item = (&'a str, Dtype, Vec<usize>, Vec<u8>)>, path: &Path) -> Result<Vec<u8>> {
    let raw: Vec<_> = tensors.collect();
    let views = raw
        .iter()
        .map(|(k, dtype, shape, data)| Ok((*k, TensorView::new(*dtype, shape.clone(), data)?)))
        .collect::<std::result::Result<Vec<_>, safetensors::SafeTensorError>>()
        .map_err(|source| Error::SafeTensors { path: path.into(), source })?;
    safetensors::serialize(views, None).map_err(|source| Error::SafeTensors { path: path.into(), source })
}

/// Parses a safetensors file's bytes into f32 tensors by name (F64, F16, BF16 and integer
/// tensors are converted to f32, as LeRobot casts on load).
///
/// # Errors
/// [`Error::SafeTensors`] for a malformed file, [`Error::Format`] for a dtype with no f32 value.
pub fn from_safetensors_bytes(bytes: &[u8], path: &Path) -> Result<BTreeMap<String, HostTensor>> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|source| Error::SafeTensors { path: path.into(), source })?;
    let mut out = BTreeMap::new();
    for (name, view) in st.iter() {
        out.insert(name.to_string(), HostTensor { shape: view.shape().to_vec(), values: to_f32(view.dtype(), name, view.data(), path)? });
    }
    Ok(out)
}

/// A safetensors tensor's little-endian values as f32.
fn to_f32(dtype: Dtype, name: &str, data: &[u8], path: &Path) -> Result<Vec<f32>> {
    let elem = match dtype {
        Dtype::F32 => Elem::F32,
        Dtype::F64 => Elem::F64,
        Dtype::F16 => Elem::F16,
        Dtype::BF16 => Elem::BF16,
        Dtype::I64 => Elem::I64,
        Dtype::I32 => Elem::I32,
        other => return Err(Error::format(path, format!("tensor {name}: dtype {other:?} cannot be read as float32"))),
    };
    Ok(elem.to_f32(data))
}

/// The element types read as f32, stored little-endian.
#[derive(Debug, Clone, Copy)]
enum Elem {
    F32,
    F64,
    F16,
    BF16,
    I64,
    I32,
}

impl Elem {
    fn to_f32(self, data: &[u8]) -> Vec<f32> {
        match self {
            Elem::F32 => data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect(),
            Elem::F64 => data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32).collect(),
            Elem::I64 => data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as f32).collect(),
            Elem::I32 => data.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as f32).collect(),
            Elem::F16 => data.chunks_exact(2).map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect(),
            Elem::BF16 => data.chunks_exact(2).map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)).collect(),
        }
    }
}

/// Reads a file of named weights into f32 tensors: safetensors, or what `torch.save` writes
/// (a state dict, as torchvision's downloads are; a checkpoint nesting one is named by dotted
/// paths). The format is told from the bytes, not the name.
///
/// # Errors
/// [`Error::Io`] when it cannot be read, [`Error::Format`] for a file of neither format or a
/// tensor of a type with no f32 value, [`Error::SafeTensors`] for a malformed safetensors file.
#[cfg(feature = "torch")]
pub fn read_weights(path: impl AsRef<Path>) -> Result<BTreeMap<String, HostTensor>> {
    use std::io::Read as _;
    let path = path.as_ref();
    let mut head = [0u8; 9];
    let mut file = std::fs::File::open(path).map_err(Error::io(path))?;
    let n = file.read(&mut head).map_err(Error::io(path))?;
    // safetensors: a little-endian header length, then the JSON header.
    if n == head.len() && head[8] == b'{' {
        return read_safetensors(path);
    }
    let reader = pytorch_reader::PytorchReader::new(path)
        .map_err(|e| Error::format(path, format!("neither safetensors nor a file torch.save wrote: {e}")))?;
    let mut out = BTreeMap::new();
    for (name, tensor) in reader.into_tensors() {
        use pytorch_reader::DType;
        let elem = match tensor.dtype() {
            DType::F32 => Elem::F32,
            DType::F64 => Elem::F64,
            DType::F16 => Elem::F16,
            DType::BF16 => Elem::BF16,
            DType::I64 => Elem::I64,
            DType::I32 => Elem::I32,
            other => return Err(Error::format(path, format!("tensor {name}: dtype {other:?} cannot be read as float32"))),
        };
        // The reader gives native-endian bytes: little-endian on every target lake builds for.
        const _: () = assert!(cfg!(target_endian = "little"));
        let bytes = tensor.read().map_err(Error::io(path))?;
        out.insert(name, HostTensor { shape: tensor.shape().to_vec(), values: elem.to_f32(&bytes) });
    }
    Ok(out)
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as u32;
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, f) => {
            // Subnormal: value = f · 2^-24.
            return if sign != 0 { -(f as f32) * 2f32.powi(-24) } else { f as f32 * 2f32.powi(-24) };
        }
        (31, 0) => sign | 0x7f80_0000,
        (31, f) => sign | 0x7f80_0000 | (f << 13),
        (e, f) => sign | (((e - 15 + 127) as u32) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

/// Reads a safetensors file (see [`from_safetensors_bytes`]).
///
/// # Errors
/// [`Error::Io`] when it cannot be read, else as [`from_safetensors_bytes`].
pub fn read_safetensors(path: impl AsRef<Path>) -> Result<BTreeMap<String, HostTensor>> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(Error::io(path))?;
    from_safetensors_bytes(&bytes, path)
}

/// Writes named f32 tensors to a safetensors file.
///
/// # Errors
/// [`Error::Io`] or [`Error::SafeTensors`].
pub fn write_safetensors<'a>(path: impl AsRef<Path>, tensors: impl IntoIterator<Item = (&'a str, &'a HostTensor)>) -> Result<()> {
    let path = path.as_ref();
    let bytes = to_safetensors_bytes(tensors, path)?;
    std::fs::write(path, bytes).map_err(Error::io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_layout() {
        let a = HostTensor::new([3, 1, 1], [0.485f32, 0.456, 0.406]);
        let b = HostTensor::vector([1.5f32]);
        let p = Path::new("x.safetensors");
        let bytes = to_safetensors_bytes([("cam.mean", &a), ("count", &b)], p).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        assert!(header.get("__metadata__").is_none());
        assert_eq!(header["cam.mean"]["dtype"], "F32");
        assert_eq!(header["cam.mean"]["shape"], serde_json::json!([3, 1, 1]));
        let back = from_safetensors_bytes(&bytes, p).unwrap();
        assert_eq!(back["cam.mean"], a);
        assert_eq!(back["count"], b);
    }

    #[cfg(feature = "torch")]
    #[test]
    fn counters_stay_int64_and_exact() {
        let dir = std::env::temp_dir().join(format!("lake-stored-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        // 2^53 + 1 has no f32 (nor f64) value: only an int64 path keeps it.
        let big = (1i64 << 53) + 1;
        let counter = Stored::I64 { shape: vec![], values: vec![big] };
        let weight = Stored::F32(HostTensor::vector([0.5, -1.0]));
        write_stored(&path, [("bn.num_batches_tracked", &counter), ("bn.weight", &weight)]).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        assert_eq!(header["bn.num_batches_tracked"]["dtype"], "I64");
        assert_eq!(header["bn.num_batches_tracked"]["shape"], serde_json::json!([]));
        assert_eq!(header["bn.weight"]["dtype"], "F32");
        let back = read_stored(&path).unwrap();
        assert_eq!(back["bn.num_batches_tracked"], counter);
        assert_eq!(back["bn.weight"], weight);
        // The f32 reader still takes the file, as LeRobot's loaders cast.
        assert_eq!(read_safetensors(&path).unwrap()["bn.num_batches_tracked"].values, [big as f32]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(feature = "torch")]
    #[test]
    fn weights_torch_save_wrote_are_read_as_safetensors_are() {
        // scripts/make_torch_weights_sample.py made both files: the zip archive of torch 1.6 and
        // later, and the legacy stream before it.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/torch");
        for file in ["nested.pth", "nested-legacy.pth"] {
            let w = read_weights(dir.join(file)).unwrap();
            let want = [
                ("block.conv.weight", HostTensor::new([2, 3], [0.0, 0.25, 0.5, 0.75, 1.0, 1.25])),
                ("block.bn.running_var", HostTensor::vector([0.5, 1.5, 2.5])),
                ("block.bn.num_batches_tracked", HostTensor::new([], [7.0])),
                ("block.half", HostTensor::vector([1.0, -2.0, 0.5])),
                ("block.brain", HostTensor::vector([1.0, -2.0, 0.25])),
                ("block.count32", HostTensor::vector([3.0, -4.0])),
                ("block.t", HostTensor::new([2, 3], [0.0, 4.0, 8.0, 1.0, 5.0, 9.0])),
            ];
            assert_eq!(w.len(), want.len(), "{file}: {:?}", w.keys());
            for (name, t) in want {
                assert_eq!(w.get(name), Some(&t), "{file}: {name}");
            }
        }
        // The same reader takes safetensors, told from the bytes.
        let tmp = std::env::temp_dir().join(format!("lake-read-weights-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let a = HostTensor::new([2, 2], [1.0, 2.0, 3.0, 4.0]);
        let st = tmp.join("weights.pth");
        write_safetensors(&st, [("a", &a)]).unwrap();
        assert_eq!(read_weights(&st).unwrap()["a"], a);
        let junk = tmp.join("junk.pth");
        std::fs::write(&junk, b"not a checkpoint at all").unwrap();
        let err = read_weights(&junk).unwrap_err().to_string();
        assert!(err.contains("junk.pth") && err.contains("neither safetensors nor"), "{err}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn half_precision_converts() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert!(f16_to_f32(0x7c00).is_infinite());
    }
}
