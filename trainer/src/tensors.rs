//! Reading and writing safetensors files of f32 tensors without libtorch.

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
    let bytes: Vec<(&str, Vec<usize>, Vec<u8>)> =
        tensors.into_iter().map(|(k, t)| (k, t.shape.clone(), t.values.iter().flat_map(|v| v.to_le_bytes()).collect())).collect();
    let views = bytes
        .iter()
        .map(|(k, shape, data)| Ok((*k, TensorView::new(Dtype::F32, shape.clone(), data)?)))
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
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect(),
            Dtype::F64 => data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32).collect(),
            Dtype::I64 => data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as f32).collect(),
            Dtype::I32 => data.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as f32).collect(),
            Dtype::F16 => data.chunks_exact(2).map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect(),
            Dtype::BF16 => data.chunks_exact(2).map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)).collect(),
            other => return Err(Error::format(path, format!("tensor {name}: dtype {other:?} cannot be read as float32"))),
        };
        out.insert(name.to_string(), HostTensor { shape: view.shape().to_vec(), values });
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

    #[test]
    fn half_precision_converts() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert!(f16_to_f32(0x7c00).is_infinite());
    }
}
