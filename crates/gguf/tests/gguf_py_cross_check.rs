//! Cross-check with gguf-py 0.19.0, an independent implementation: `data/gguf_py_all_types.bin`
//! was written by `data/make_gguf_py_all_types.py`. We read every value back as the script
//! wrote it, and our writer, given the same content, must produce the same bytes.

use ds4_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use half::f16;

const GGUF_PY_FILE: &[u8] = include_bytes!("data/gguf_py_all_types.bin");

fn s(v: &str) -> Value {
    Value::String(v.to_owned())
}

fn arr(items: impl IntoIterator<Item = Value>) -> Value {
    Value::Array(items.into_iter().collect())
}

/// The script's metadata, in its order (gguf-py puts general.architecture first).
fn script_metadata() -> Vec<(&'static str, Value)> {
    let f32s = |v: &[f32]| arr(v.iter().map(|&x| Value::F32(x)));
    vec![
        ("general.architecture", s("testarch")),
        ("general.alignment", Value::U32(64)),
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(1.5)),
        ("t.u64", Value::U64(18_000_000_000_000_000_000)),
        ("t.i64", Value::I64(-9_000_000_000_000_000_000)),
        ("t.f64", Value::F64(-2.25)),
        ("t.bool", Value::Bool(true)),
        ("t.str", s("héllo ☃ \n\t\"")),
        ("t.arr_i32", arr([1, -2, 3].map(Value::I32))),
        ("t.arr_str", arr([s("a"), s(""), s("ĠĠ")])),
        ("t.arr_u8", arr([0, 1, 255].map(Value::U8))),
        ("t.arr_f32", f32s(&[0.5, -1.0])),
        ("t.arr_bool", arr([Value::Bool(true), Value::Bool(false)])),
        (
            "t.nested",
            arr([arr([1, 2].map(Value::I32)), arr([Value::I32(3)])]),
        ),
        ("t.nested_str", arr([arr([s("x"), s("y")]), arr([s("z")])])),
        (
            "t.nested3",
            arr([arr([f32s(&[1.5]), f32s(&[2.5, 3.5])]), arr([f32s(&[4.5])])]),
        ),
    ]
}

fn le_bytes<const N: usize>(values: impl IntoIterator<Item = [u8; N]>) -> Vec<u8> {
    values.into_iter().flatten().collect()
}

/// The script's tensors: (name, ggml dims, type, bytes).
fn script_tensors() -> Vec<(&'static str, Vec<u64>, GgmlType, Vec<u8>)> {
    vec![
        (
            "f32.vec",
            vec![3],
            GgmlType::F32,
            le_bytes([1.0f32, -2.0, 3.5].map(f32::to_le_bytes)),
        ),
        (
            "f16.mat",
            vec![3, 2],
            GgmlType::F16,
            le_bytes((0..6).map(|i| f16::from_f32(i as f32).to_le_bytes())),
        ),
        ("q8.mat", vec![32, 2], GgmlType::Q8_0, (0..68).collect()),
        (
            "i32.vec",
            vec![2],
            GgmlType::I32,
            le_bytes([7i32, -8].map(i32::to_le_bytes)),
        ),
    ]
}

#[test]
fn reads_every_value_gguf_py_wrote() {
    let file = GgufFile::from_bytes(GGUF_PY_FILE.to_vec()).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 64);
    let read: Vec<(&str, &Value)> = file.metadata().iter().collect();
    let expected = script_metadata();
    let expected: Vec<(&str, &Value)> = expected.iter().map(|(k, v)| (*k, v)).collect();
    assert_eq!(read, expected);

    // Offsets as gguf-py's own reader reports them: 0, 64, 128, 256 from data offset 1088.
    assert_eq!(file.data_offset(), 1088);
    let offsets: Vec<u64> = file.tensors().iter().map(|t| t.offset).collect();
    assert_eq!(offsets, [0, 64, 128, 256]);
    for (name, dims, dtype, data) in script_tensors() {
        let t = file.require_tensor(name).unwrap();
        assert_eq!((&t.dims, t.dtype), (&dims, dtype), "{name}");
        assert_eq!(file.tensor_data(t), data.as_slice(), "{name}");
    }
    let f16s = file.tensor_as::<f16>(file.require_tensor("f16.mat").unwrap());
    let f16s: Vec<f32> = f16s.unwrap().iter().map(|h| h.to_f32()).collect();
    assert_eq!(f16s, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let i32s = file.tensor_as::<i32>(file.require_tensor("i32.vec").unwrap());
    assert_eq!(i32s.unwrap(), [7, -8]);
}

#[test]
fn writer_output_matches_gguf_py_byte_for_byte() {
    let mut writer = GgufWriter::new();
    for (key, value) in script_metadata() {
        writer.add_metadata(key, value).unwrap();
    }
    for (name, dims, dtype, data) in script_tensors() {
        writer.add_tensor(name, &dims, dtype, data).unwrap();
    }
    let ours = writer.to_bytes();
    assert_eq!(ours.len(), GGUF_PY_FILE.len());
    if let Some(at) = ours.iter().zip(GGUF_PY_FILE).position(|(a, b)| a != b) {
        panic!("first difference at byte {at}");
    }
}
