//! A GGUF reader: header, metadata of every value type, tensor infos, alignment, and
//! memory-mapped tensor data with dequantization to f32 (F32, F16, BF16, Q4_0, Q4_1, Q8_0,
//! and the K-quants Q4_K, Q5_K, Q6_K of llama.cpp's `ggml-quants.c` layouts).
//!
//! Format (llama.cpp's `gguf.h`, version 2 and 3): magic `GGUF`, version `u32`, tensor count
//! and metadata count `u64`; metadata as (string key, `u32` type, value); tensor infos as
//! (name, `u32` dims, `u64` extents with the fastest-varying first, `u32` type, `u64` offset
//! relative to the data section); the data section starts at the next multiple of
//! `general.alignment` (default 32). Every read is bounds-checked: a truncated or corrupt
//! file gives a [`GgufError`] naming the field or tensor and the offset, never a panic or an
//! out-of-bounds read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};

/// The tensors of layer `l` of a Llama GGUF model as the runtimes stack them, each as
/// ((name, rows) parts, fan-in): attention norm, QKV, output projection, MLP norm, gate
/// and up, down. `dims` = (hidden, query width, KV width, intermediate).
pub fn llama_layer(l: u32, dims: [u64; 4]) -> [(Vec<(String, u64)>, u64); 6] {
    let [h, qd, kvd, inter] = dims;
    let n = |t: &str| format!("blk.{l}.{t}.weight");
    [
        (vec![(n("attn_norm"), 1)], h),
        (
            vec![(n("attn_q"), qd), (n("attn_k"), kvd), (n("attn_v"), kvd)],
            h,
        ),
        (vec![(n("attn_output"), h)], qd),
        (vec![(n("ffn_norm"), 1)], h),
        (vec![(n("ffn_gate"), inter), (n("ffn_up"), inter)], h),
        (vec![(n("ffn_down"), h)], inter),
    ]
}

/// Errors reading a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The bytes do not follow the format.
    #[error("{path}: {what} at byte {offset}")]
    Corrupt {
        /// File.
        path: PathBuf,
        /// What was expected.
        what: String,
        /// Where.
        offset: u64,
    },
    /// A tensor is missing or has an unexpected shape or type.
    #[error("{path}: tensor `{tensor}`: {what}")]
    Tensor {
        /// File.
        path: PathBuf,
        /// Tensor name.
        tensor: String,
        /// What is wrong.
        what: String,
    },
    /// A metadata key is missing or has the wrong type.
    #[error("{path}: metadata `{key}`: {what}")]
    Metadata {
        /// File.
        path: PathBuf,
        /// Key.
        key: String,
        /// What is wrong.
        what: String,
    },
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `u8`
    U8(u8),
    /// `i8`
    I8(i8),
    /// `u16`
    U16(u16),
    /// `i16`
    I16(i16),
    /// `u32`
    U32(u32),
    /// `i32`
    I32(i32),
    /// `f32`
    F32(f32),
    /// `bool`
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// Array of values.
    Array(Vec<Value>),
    /// `u64`
    U64(u64),
    /// `i64`
    I64(i64),
    /// `f64`
    F64(f64),
}

impl Value {
    /// The value as an unsigned integer, if it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(u64::from(v)),
            Value::U16(v) => Some(u64::from(v)),
            Value::U32(v) => Some(u64::from(v)),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(f64::from(v)),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

/// Tensor element types (the `ggml_type` numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// bfloat16.
    BF16,
    /// 4-bit, blocks of 32: f16 scale d, values (q - 8) * d.
    Q4_0,
    /// 4-bit, blocks of 32: f16 scale d and min m, values q * d + m.
    Q4_1,
    /// 8-bit, blocks of 32: f16 scale d, values q * d.
    Q8_0,
    /// K-quant, 4-bit: super-blocks of 256 in 8 sub-blocks of 32 with 6-bit scales and
    /// mins under f16 super-scales (144 bytes).
    Q4K,
    /// K-quant, 5-bit: as Q4_K with a fifth bit per value (176 bytes).
    Q5K,
    /// K-quant, 6-bit: super-blocks of 256 in 16 sub-blocks of 16 with 8-bit scales under
    /// an f16 super-scale (210 bytes).
    Q6K,
    /// Any other type (listed, but not dequantized here).
    Other(u32),
}

impl GgmlType {
    fn from_u32(t: u32) -> GgmlType {
        match t {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            30 => GgmlType::BF16,
            other => GgmlType::Other(other),
        }
    }

    /// (elements per block, bytes per block), when known.
    pub fn block(self) -> Option<(u64, u64)> {
        match self {
            GgmlType::F32 => Some((1, 4)),
            GgmlType::F16 | GgmlType::BF16 => Some((1, 2)),
            GgmlType::Q4_0 => Some((32, 18)),
            GgmlType::Q4_1 => Some((32, 20)),
            GgmlType::Q8_0 => Some((32, 34)),
            GgmlType::Q4K => Some((256, 144)),
            GgmlType::Q5K => Some((256, 176)),
            GgmlType::Q6K => Some((256, 210)),
            GgmlType::Other(_) => None,
        }
    }
}

/// One tensor's description.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Extents, fastest-varying first (`[in, out]` for a weight matrix).
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Offset of the data from the start of the file.
    pub offset: u64,
    /// Bytes of data (when the type is known).
    pub bytes: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A memory-mapped GGUF file.
pub struct Gguf {
    path: PathBuf,
    map: memmap2::Mmap,
    /// GGUF version.
    pub version: u32,
    /// Metadata by key (ordered).
    pub metadata: BTreeMap<String, Value>,
    /// Tensors by name (ordered).
    pub tensors: BTreeMap<String, TensorInfo>,
    /// Start of the tensor data section.
    pub data_offset: u64,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn corrupt(&self, what: impl Into<String>) -> GgufError {
        GgufError::Corrupt {
            path: self.path.to_path_buf(),
            what: what.into(),
            offset: self.pos as u64,
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| self.corrupt(format!("truncated file: {n} bytes of {what} expected")))?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let n = self.u64(what)?;
        let n = usize::try_from(n).map_err(|_| self.corrupt(format!("{what}: length {n}")))?;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| self.corrupt(format!("{what}: invalid UTF-8")))
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.array(key)?)),
            1 => Value::I8(i8::from_le_bytes(self.array(key)?)),
            2 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            4 => Value::U32(self.u32(key)?),
            5 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            7 => Value::Bool(self.array::<1>(key)?[0] != 0),
            8 => Value::String(self.string(key)?),
            9 => {
                if depth > 4 {
                    return Err(self.corrupt(format!("{key}: arrays nested too deep")));
                }
                let elem = self.u32(key)?;
                let n = self.u64(key)?;
                // Every element takes at least one byte: a count larger than what is left
                // is corrupt (and must not allocate).
                if n > (self.bytes.len() - self.pos) as u64 {
                    return Err(self.corrupt(format!("{key}: array of {n} elements")));
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            other => return Err(self.corrupt(format!("{key}: unknown value type {other}"))),
        })
    }
}

impl Gguf {
    /// Opens and parses a GGUF file (tensor data stays memory-mapped).
    pub fn open(path: &Path) -> Result<Gguf, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        if path.is_dir() {
            return Err(io(std::io::Error::other("a directory, not a GGUF file")));
        }
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and lives as long as `Gguf`; a file changed under
        // us can give wrong values but every access is bounds-checked against the map.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let mut c = Cursor {
            bytes: &map,
            pos: 0,
            path,
        };
        if c.take(4, "magic")? != b"GGUF" {
            c.pos = 0;
            return Err(c.corrupt("not a GGUF file (magic `GGUF` expected)"));
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(c.corrupt(format!("unsupported GGUF version {version}")));
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let ty = c.u32(&key)?;
            let v = c.value(ty, &key, 0)?;
            metadata.insert(key, v);
        }
        let mut infos = Vec::new();
        for _ in 0..n_tensors {
            let name = c.string("tensor name")?;
            let nd = c.u32(&name)?;
            if nd == 0 || nd > 4 {
                return Err(c.corrupt(format!("tensor `{name}`: {nd} dimensions")));
            }
            let dims = (0..nd)
                .map(|_| c.u64(&name))
                .collect::<Result<Vec<_>, _>>()?;
            let ty = GgmlType::from_u32(c.u32(&name)?);
            let offset = c.u64(&name)?;
            infos.push((name, dims, ty, offset));
        }
        let alignment = metadata
            .get("general.alignment")
            .and_then(Value::as_u64)
            .unwrap_or(32)
            .max(1);
        let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
        let mut tensors = BTreeMap::new();
        for (name, dims, ty, rel) in infos {
            let elements = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| GgufError::Tensor {
                    path: path.to_path_buf(),
                    tensor: name.clone(),
                    what: format!("dimensions {dims:?} overflow"),
                })?;
            let bytes = match ty.block() {
                Some((per, size)) => {
                    if elements % per != 0 {
                        return Err(GgufError::Tensor {
                            path: path.to_path_buf(),
                            tensor: name,
                            what: format!("{elements} elements is not a multiple of the {per}-element block of {ty:?}"),
                        });
                    }
                    elements / per * size
                }
                None => 0,
            };
            let offset = data_offset.saturating_add(rel);
            if offset.saturating_add(bytes) > map.len() as u64 {
                return Err(GgufError::Tensor {
                    path: path.to_path_buf(),
                    tensor: name,
                    what: format!(
                        "data [{offset}, {}) lies beyond the end of the file ({} bytes): truncated?",
                        offset.saturating_add(bytes),
                        map.len()
                    ),
                });
            }
            tensors.insert(
                name.clone(),
                TensorInfo {
                    name,
                    dims,
                    ty,
                    offset,
                    bytes,
                },
            );
        }
        Ok(Gguf {
            path: path.to_path_buf(),
            map,
            version,
            metadata,
            tensors,
            data_offset,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A metadata number.
    pub fn meta_f64(&self, key: &str) -> Result<f64, GgufError> {
        self.metadata
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| GgufError::Metadata {
                path: self.path.clone(),
                key: key.into(),
                what: "missing or not a number".into(),
            })
    }

    /// A metadata unsigned integer.
    pub fn meta_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.metadata
            .get(key)
            .and_then(Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| GgufError::Metadata {
                path: self.path.clone(),
                key: key.into(),
                what: "missing or not an unsigned 32-bit integer".into(),
            })
    }

    /// A tensor's description.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensors.get(name).ok_or_else(|| GgufError::Tensor {
            path: self.path.clone(),
            tensor: name.into(),
            what: "not in the file".into(),
        })
    }

    /// The rows of several tensors stacked (e.g. Q, K and V into one QKV weight), each
    /// checked to be `fan_in` wide with the given number of rows (1: a vector), and
    /// dequantized to f32, row-major `[row][fan_in]`.
    pub fn stacked(&self, parts: &[(String, u64)], fan_in: u64) -> Result<Vec<f32>, GgufError> {
        let mut all = Vec::new();
        for (name, rows) in parts {
            let t = self.tensor(name)?;
            let want = if *rows == 1 {
                vec![fan_in]
            } else {
                vec![fan_in, *rows]
            };
            if t.dims != want {
                return Err(GgufError::Tensor {
                    path: self.path.clone(),
                    tensor: name.clone(),
                    what: format!("extents {:?}, expected {want:?}", t.dims),
                });
            }
            all.extend(self.dequantize(name)?);
        }
        Ok(all)
    }

    /// The rows of several tensors stacked as in [`Gguf::stacked`], but kept in their
    /// 32-value block format (the raw bytes) when every part is Q4_0, Q4_1 or Q8_0 of one
    /// type and `fan_in` is a multiple of 32; `None` otherwise.
    pub fn stacked_blocks(
        &self,
        parts: &[(String, u64)],
        fan_in: u64,
    ) -> Result<Option<(GgmlType, Vec<u8>)>, GgufError> {
        let mut ty = None;
        let mut all = Vec::new();
        for (name, rows) in parts {
            let t = self.tensor(name)?;
            let blocky = matches!(t.ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0);
            if !blocky
                || ty.is_some_and(|x| x != t.ty)
                || !fan_in.is_multiple_of(32)
                || t.dims != [fan_in, *rows]
            {
                return Ok(None);
            }
            ty = Some(t.ty);
            all.extend_from_slice(&self.map[t.offset as usize..(t.offset + t.bytes) as usize]);
        }
        Ok(ty.map(|t| (t, all)))
    }

    /// Dequantizes a tensor to f32 (row-major, `dims[0]` fastest).
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let t = self.tensor(name)?;
        let data = &self.map[t.offset as usize..(t.offset + t.bytes) as usize];
        let n = t.elements() as usize;
        let mut out = Vec::with_capacity(n);
        match t.ty {
            GgmlType::F32 => out.extend(
                data.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
            GgmlType::F16 => out.extend(
                data.chunks_exact(2)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()),
            ),
            GgmlType::BF16 => out.extend(
                data.chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            ),
            GgmlType::Q4_0 => {
                for b in data.chunks_exact(18) {
                    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                    dequant_nibbles(&b[2..18], &mut out, |q| (q as f32 - 8.0) * d);
                }
            }
            GgmlType::Q4_1 => {
                for b in data.chunks_exact(20) {
                    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                    let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
                    dequant_nibbles(&b[4..20], &mut out, |q| q as f32 * d + m);
                }
            }
            GgmlType::Q8_0 => {
                for b in data.chunks_exact(34) {
                    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                    out.extend(b[2..34].iter().map(|&q| f32::from(q as i8) * d));
                }
            }
            GgmlType::Q4K => {
                for b in data.chunks_exact(144) {
                    dequant_k4(b, None, &b[16..144], &mut out);
                }
            }
            GgmlType::Q5K => {
                for b in data.chunks_exact(176) {
                    dequant_k4(b, Some(&b[16..48]), &b[48..176], &mut out);
                }
            }
            GgmlType::Q6K => {
                for b in data.chunks_exact(210) {
                    dequant_q6k(b, &mut out);
                }
            }
            GgmlType::Other(ty) => {
                return Err(GgufError::Tensor {
                    path: self.path.clone(),
                    tensor: name.into(),
                    what: format!("ggml type {ty} is not supported yet"),
                })
            }
        }
        debug_assert_eq!(out.len(), n);
        Ok(out)
    }
}

/// The 6-bit scale and min of sub-block `j` (0-7) of a Q4_K/Q5_K super-block, packed in
/// 12 bytes: sub-blocks 0-3 in the low 6 bits of bytes j and j + 4, sub-blocks 4-7 in the
/// nibbles of bytes 8-11 with their top 2 bits in the high bits of bytes j - 4 and j.
fn k4_scale_min(j: usize, q: &[u8]) -> (f32, f32) {
    if j < 4 {
        (f32::from(q[j] & 63), f32::from(q[j + 4] & 63))
    } else {
        let d = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        let m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        (f32::from(d), f32::from(m))
    }
}

/// One Q4_K (no `qh`) or Q5_K super-block: f16 d and dmin, 12 bytes of scales, then per
/// 64 values one 32-byte run of nibbles: low nibbles are the first 32 values (sub-block
/// 2i), high nibbles the next 32 (2i + 1); Q5_K's fifth bits sit in `qh`, bit 2i and
/// 2i + 1 of byte l for value l of those sub-blocks. Value = d * scale * q - dmin * min.
fn dequant_k4(b: &[u8], qh: Option<&[u8]>, qs: &[u8], out: &mut Vec<f32>) {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
    let dmin = f16::from_le_bytes([b[2], b[3]]).to_f32();
    let scales = &b[4..16];
    for (i, run) in qs.chunks_exact(32).enumerate() {
        for half in 0..2 {
            let j = 2 * i + half;
            let (sc, m) = k4_scale_min(j, scales);
            let (dj, mj) = (d * sc, dmin * m);
            for (l, &byte) in run.iter().enumerate() {
                let low = if half == 0 { byte & 0x0f } else { byte >> 4 };
                let high = qh.map_or(0, |h| ((h[l] >> j) & 1) << 4);
                out.push(dj * f32::from(low | high) - mj);
            }
        }
    }
}

/// One Q6_K super-block: `ql` (128 bytes of low nibbles), `qh` (64 bytes of 2-bit highs),
/// 16 signed 8-bit scales and an f16 d; in each half of 128 values, value l + 32 k (k =
/// 0-3) takes nibble k / 2 of ql[l + 32 (k % 2)] and bits 2k-2k+1 of qh[l], minus 32,
/// times d and the scale of its 16-value sub-block.
fn dequant_q6k(b: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = f16::from_le_bytes([b[208], b[209]]).to_f32();
    for h in 0..2 {
        let (ql, qh, sc) = (&ql[64 * h..], &qh[32 * h..], &scales[8 * h..]);
        let mut vals = [0.0f32; 128];
        for l in 0..32 {
            let is = l / 16;
            let hi = qh[l];
            let q = [
                (ql[l] & 0x0f) | ((hi & 3) << 4),
                (ql[l + 32] & 0x0f) | (((hi >> 2) & 3) << 4),
                (ql[l] >> 4) | (((hi >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((hi >> 6) & 3) << 4),
            ];
            for (k, &qk) in q.iter().enumerate() {
                let scale = f32::from(sc[is + 2 * k] as i8);
                vals[l + 32 * k] = d * scale * f32::from(qk as i8 - 32);
            }
        }
        out.extend_from_slice(&vals);
    }
}

/// A 4-bit block of 32 values: the low nibbles are elements 0-15, the high nibbles 16-31.
fn dequant_nibbles(qs: &[u8], out: &mut Vec<f32>, f: impl Fn(u8) -> f32) {
    out.extend(qs.iter().map(|&b| f(b & 0x0f)));
    out.extend(qs.iter().map(|&b| f(b >> 4)));
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    /// Writes a small GGUF: metadata of several types and three tensors (F32, Q4_1, Q8_0).
    fn sample(path: &Path, truncate: usize) {
        let mut b: Vec<u8> = Vec::new();
        let s = |b: &mut Vec<u8>, x: &str| {
            b.extend((x.len() as u64).to_le_bytes());
            b.extend(x.as_bytes());
        };
        b.extend(b"GGUF");
        b.extend(3u32.to_le_bytes());
        b.extend(3u64.to_le_bytes()); // tensors
        b.extend(3u64.to_le_bytes()); // metadata
        s(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        s(&mut b, "llama");
        s(&mut b, "llama.rope.freq_base");
        b.extend(6u32.to_le_bytes());
        b.extend(10000.0f32.to_le_bytes());
        s(&mut b, "list");
        b.extend(9u32.to_le_bytes());
        b.extend(4u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(7u32.to_le_bytes());
        b.extend(9u32.to_le_bytes());
        // tensors: f (F32, 4), q (Q4_1, 32), e (Q8_0, 32)
        let mut off = 0u64;
        for (name, n, ty, bytes) in [("f", 4u64, 0u32, 16u64), ("q", 32, 3, 20), ("e", 32, 8, 34)] {
            s(&mut b, name);
            b.extend(1u32.to_le_bytes());
            b.extend(n.to_le_bytes());
            b.extend(ty.to_le_bytes());
            b.extend(off.to_le_bytes());
            off += bytes.div_ceil(32) * 32;
        }
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
        for x in [1.0f32, -2.0, 0.5, 3.25] {
            b.extend(x.to_le_bytes());
        }
        b.resize(b.len() + 16, 0);
        // Q4_1: d = 0.5, m = -1; nibble i (low) = i % 16, high = 15 - i % 16.
        b.extend(f16::from_f32(0.5).to_le_bytes());
        b.extend(f16::from_f32(-1.0).to_le_bytes());
        for i in 0..16u8 {
            b.push(i | ((15 - i) << 4));
        }
        b.resize(b.len() + 12, 0);
        // Q8_0: d = 0.25, q = -16..16
        b.extend(f16::from_f32(0.25).to_le_bytes());
        for i in 0..32i32 {
            b.push((i - 16) as i8 as u8);
        }
        b.truncate(b.len() - truncate);
        let mut f = std::fs::File::create(path).unwrap();
        f.write_all(&b).unwrap();
    }

    #[test]
    fn reads_metadata_and_dequantizes() {
        let dir = tempfile_dir();
        let p = dir.join("t.gguf");
        sample(&p, 0);
        let g = Gguf::open(&p).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.metadata["general.architecture"].as_str(), Some("llama"));
        assert_eq!(g.meta_f64("llama.rope.freq_base").unwrap(), 10000.0);
        assert_eq!(
            g.metadata["list"],
            Value::Array(vec![Value::U32(7), Value::U32(9)])
        );
        assert_eq!(g.dequantize("f").unwrap(), vec![1.0, -2.0, 0.5, 3.25]);
        let q = g.dequantize("q").unwrap();
        assert_eq!(q[0], -1.0);
        assert_eq!(q[3], 0.5);
        assert_eq!(q[16], 6.5); // high nibble of byte 0 = 15
        let e = g.dequantize("e").unwrap();
        assert_eq!(e[0], -4.0);
        assert_eq!(e[31], 3.75);
        assert!(g.dequantize("missing").is_err());
    }

    /// Packs 6-bit scales and mins of 8 sub-blocks as Q4_K/Q5_K store them.
    fn k4_pack(sc: [u8; 8], m: [u8; 8]) -> [u8; 12] {
        let mut q = [0u8; 12];
        for j in 0..4 {
            q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            q[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            q[j + 8] = (sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4);
        }
        q
    }

    #[test]
    fn k_quants_dequantize_by_their_layouts() {
        let half = |x: f32| f16::from_f32(x).to_le_bytes();
        // Scales above 15 and 31 exercise the packed high bits.
        let sc = [1u8, 2, 3, 4, 40, 41, 42, 63];
        let m = [0u8, 2, 4, 6, 50, 51, 52, 33];
        for five in [false, true] {
            let q: Vec<u8> = (0..256u32)
                .map(|v| {
                    if five {
                        (v * 11 % 32) as u8
                    } else {
                        (v * 7 % 16) as u8
                    }
                })
                .collect();
            let mut b = Vec::new();
            b.extend(half(1.0));
            b.extend(half(0.5));
            b.extend(k4_pack(sc, m));
            if five {
                let mut qh = [0u8; 32];
                for (v, &x) in q.iter().enumerate() {
                    qh[v % 32] |= (x >> 4) << (v / 32);
                }
                b.extend(qh);
            }
            for i in 0..4 {
                for l in 0..32 {
                    b.push((q[64 * i + l] & 0x0f) | ((q[64 * i + 32 + l] & 0x0f) << 4));
                }
            }
            let mut out = Vec::new();
            let (qh, qs) = if five {
                (Some(&b[16..48]), &b[48..176])
            } else {
                (None, &b[16..144])
            };
            dequant_k4(&b, qh, qs, &mut out);
            assert_eq!(out.len(), 256);
            for (v, (&x, &got)) in q.iter().zip(&out).enumerate() {
                let j = v / 32;
                let want = f32::from(sc[j]) * f32::from(x) - 0.5 * f32::from(m[j]);
                assert_eq!(got, want, "five {five}, value {v}");
            }
        }
        // Q6_K: signed scales per 16 values, values q - 32.
        let scales: Vec<i8> = (0..16).map(|i| i as i8 - 5).collect();
        let q: Vec<u8> = (0..256u32).map(|v| (v * 13 % 64) as u8).collect();
        let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
        for (v, &x) in q.iter().enumerate() {
            let (h, w) = (v / 128, v % 128);
            let (k, l) = (w / 32, w % 32);
            let at = 64 * h + l + 32 * (k % 2);
            ql[at] |= if k < 2 { x & 0x0f } else { (x & 0x0f) << 4 };
            qh[32 * h + l] |= (x >> 4) << (2 * k);
        }
        let mut b = Vec::new();
        b.extend(ql);
        b.extend(qh);
        b.extend(scales.iter().map(|&s| s as u8));
        b.extend(half(0.25));
        let mut out = Vec::new();
        dequant_q6k(&b, &mut out);
        assert_eq!(out.len(), 256);
        for (v, (&x, &got)) in q.iter().zip(&out).enumerate() {
            let want = 0.25 * f32::from(scales[v / 16]) * (f32::from(x) - 32.0);
            assert_eq!(got, want, "q6_k value {v}");
        }
        assert_eq!(GgmlType::from_u32(12).block(), Some((256, 144)));
        assert_eq!(GgmlType::from_u32(13).block(), Some((256, 176)));
        assert_eq!(GgmlType::from_u32(14).block(), Some((256, 210)));
    }

    #[test]
    fn truncated_file_is_an_error_naming_the_tensor() {
        let dir = tempfile_dir();
        let p = dir.join("t.gguf");
        sample(&p, 10);
        match Gguf::open(&p) {
            Err(GgufError::Tensor { tensor, what, .. }) => {
                assert_eq!(tensor, "e");
                assert!(what.contains("beyond the end"), "{what}");
            }
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("a truncated file must not open"),
        }
        // Cut inside the header: an error with the offset, no panic.
        for cut in [1usize, 200, 300] {
            let full = std::fs::read(&p).unwrap();
            let short = &full[..full.len().min(cut)];
            std::fs::write(dir.join("s.gguf"), short).unwrap();
            assert!(Gguf::open(&dir.join("s.gguf")).is_err());
        }
    }

    /// The real SmolLM2-135M-Instruct Q4_1 file (DEVELOPERS.md): `SIM_SMOLLM2_GGUF`, or the
    /// cache `.ci/run` fills.
    pub(crate) fn smollm2_path() -> Option<PathBuf> {
        let p = std::env::var_os("SIM_SMOLLM2_GGUF")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| {
                    PathBuf::from(h).join(".cache/sim-models/SmolLM2-135M-Instruct.Q4_1.gguf")
                })
            })?;
        p.exists().then_some(p)
    }

    #[test]
    #[ignore = "needs the SmolLM2 GGUF (SIM_SMOLLM2_GGUF or ~/.cache/sim-models); .ci/run fetches it"]
    fn reads_smollm2() {
        let p = smollm2_path().expect("SmolLM2 GGUF not found");
        let g = Gguf::open(&p).unwrap();
        assert_eq!(g.data_offset, 1_785_664);
        assert_eq!(g.tensors.len(), 272);
        assert_eq!(g.meta_u32("llama.block_count").unwrap(), 30);
        assert_eq!(g.meta_u32("llama.attention.head_count_kv").unwrap(), 3);
        let e = g.tensor("token_embd.weight").unwrap();
        assert_eq!((e.dims.clone(), e.ty), (vec![576, 49152], GgmlType::Q8_0));
        assert!(!g.tensors.contains_key("output.weight"));
        let q = g.dequantize("blk.0.attn_q.weight").unwrap();
        assert_eq!(q.len(), 576 * 576);
        assert!(q.iter().all(|x| x.is_finite()));
        let rms = (q.iter().map(|x| x * x).sum::<f32>() / q.len() as f32).sqrt();
        assert!(rms > 1e-3 && rms < 1.0, "{rms}");
        let shape = crate::cuda::gguf_shape(&g).unwrap();
        assert_eq!((shape.heads, shape.head_dim, shape.vocab), (9, 64, 49152));
        assert!(shape.tied_embeddings && shape.rope_interleaved);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "gguf-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
