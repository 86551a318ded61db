//! proptest strategies for metadata values, tensors and whole files built by `GgufWriter`.

use ds4_gguf::{GgmlType, GgufWriter, Value};
use proptest::collection::vec;
use proptest::prelude::*;

/// A float that is not NaN (NaN != NaN would defeat value comparisons).
fn f32_not_nan() -> impl Strategy<Value = f32> {
    any::<f32>().prop_filter("NaN", |f| !f.is_nan())
}

fn f64_not_nan() -> impl Strategy<Value = f64> {
    any::<f64>().prop_filter("NaN", |f| !f.is_nan())
}

/// Scalars of GGUF value type id `ty` (any id but 9, the array type).
fn scalar_of(ty: u32) -> BoxedStrategy<Value> {
    match ty {
        0 => any::<u8>().prop_map(Value::U8).boxed(),
        1 => any::<i8>().prop_map(Value::I8).boxed(),
        2 => any::<u16>().prop_map(Value::U16).boxed(),
        3 => any::<i16>().prop_map(Value::I16).boxed(),
        4 => any::<u32>().prop_map(Value::U32).boxed(),
        5 => any::<i32>().prop_map(Value::I32).boxed(),
        6 => f32_not_nan().prop_map(Value::F32).boxed(),
        7 => any::<bool>().prop_map(Value::Bool).boxed(),
        8 => "\\PC{0,12}".prop_map(Value::String).boxed(),
        10 => any::<u64>().prop_map(Value::U64).boxed(),
        11 => any::<i64>().prop_map(Value::I64).boxed(),
        _ => f64_not_nan().prop_map(Value::F64).boxed(),
    }
}

fn scalar_type() -> impl Strategy<Value = u32> {
    (0u32..13).prop_filter("array", |&t| t != 9)
}

/// A homogeneous array, nested up to `depth` more levels (inner arrays may differ in their
/// own element types, as the format allows).
fn array(depth: u32) -> BoxedStrategy<Value> {
    let scalars = scalar_type()
        .prop_flat_map(|t| vec(scalar_of(t), 0..6))
        .prop_map(Value::Array);
    if depth == 0 {
        return scalars.boxed();
    }
    prop_oneof![
        3 => scalars,
        1 => vec(array(depth - 1), 0..4).prop_map(Value::Array),
    ]
    .boxed()
}

/// Any metadata value.
pub fn value() -> BoxedStrategy<Value> {
    prop_oneof![3 => scalar_type().prop_flat_map(scalar_of), 1 => array(3)].boxed()
}

/// A tensor: (ggml dims, type, data of the right length).
pub fn tensor() -> impl Strategy<Value = (Vec<u64>, GgmlType, Vec<u8>)> {
    let dtype = (0..GgmlType::ALL.len()).prop_map(|i| GgmlType::ALL[i]);
    (dtype, 1u64..3, vec(0u64..4, 0..4)).prop_flat_map(|(dtype, blocks, rest)| {
        let mut dims = vec![blocks * dtype.block_size() as u64];
        dims.extend(rest);
        let rows: u64 = dims[1..].iter().product();
        let n_bytes = (blocks * dtype.type_size() as u64 * rows) as usize;
        vec(any::<u8>(), n_bytes).prop_map(move |data| (dims.clone(), dtype, data))
    })
}

/// What a file is built from: alignment (None: default), metadata, tensors.
#[derive(Debug, Clone)]
pub struct Content {
    pub alignment: Option<u32>,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl Content {
    /// The file, written by `GgufWriter` (keys and names are unique by construction).
    pub fn writer(&self) -> GgufWriter {
        let mut w = GgufWriter::new();
        if let Some(a) = self.alignment {
            w.set_alignment(a).unwrap();
        }
        for (k, v) in &self.metadata {
            w.add_metadata(k.clone(), v.clone()).unwrap();
        }
        for (name, dims, dtype, data) in &self.tensors {
            w.add_tensor(name.clone(), dims, *dtype, data.clone())
                .unwrap();
        }
        w
    }
}

/// Small files: up to 6 keys and 4 tensors.
pub fn content() -> impl Strategy<Value = Content> {
    let alignment = prop_oneof![Just(None), (0u32..8).prop_map(|p| Some(1 << p))];
    (alignment, vec(value(), 0..6), vec(tensor(), 0..4)).prop_map(|(alignment, values, tensors)| {
        Content {
            alignment,
            metadata: values
                .into_iter()
                .enumerate()
                .map(|(i, v)| (format!("key.{i}"), v))
                .collect(),
            tensors: tensors
                .into_iter()
                .enumerate()
                .map(|(i, (dims, dtype, data))| (format!("blk.{i}.weight"), dims, dtype, data))
                .collect(),
        }
    })
}
