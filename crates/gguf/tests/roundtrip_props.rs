//! Round trips: whatever `GgufWriter` writes, `GgufFile` reads back identically, and
//! writing what was read gives the same bytes.

mod common;

use common::arb;
use ds4_gguf::{GgmlType, GgufFile, GgufWriter, TensorInfo, Value};
use proptest::prelude::*;

/// Rebuilds a writer from a read file (metadata in file order, tensors in directory order).
fn rewrite(file: &GgufFile) -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        w.add_metadata(k, v.clone()).unwrap();
    }
    for t in file.tensors() {
        w.add_tensor(t.name.clone(), &t.dims, t.dtype, file.tensor_data(t))
            .unwrap();
    }
    w
}

proptest! {
    #[test]
    fn written_files_read_back_identically(content in arb::content()) {
        let writer = content.writer();
        let bytes = writer.to_bytes();
        let file = GgufFile::from_bytes(bytes.clone()).unwrap();

        let mut expected: Vec<(String, Value)> = Vec::new();
        if let Some(a) = content.alignment {
            expected.push(("general.alignment".into(), Value::U32(a)));
        }
        expected.extend(content.metadata.iter().cloned());
        let read: Vec<(String, Value)> =
            file.metadata().iter().map(|(k, v)| (k.to_owned(), v.clone())).collect();
        prop_assert_eq!(read, expected);

        let alignment = u64::from(content.alignment.unwrap_or(32));
        prop_assert_eq!(file.alignment(), alignment);
        prop_assert_eq!(file.data_offset() % alignment, 0);
        let infos = writer.tensor_infos();
        prop_assert_eq!(file.tensors(), infos.as_slice());
        for ((name, dims, dtype, data), t) in content.tensors.iter().zip(file.tensors()) {
            prop_assert_eq!((&t.name, &t.dims, t.dtype), (name, dims, *dtype));
            prop_assert_eq!(t.offset % alignment, 0);
            prop_assert_eq!(file.tensor_data(t), data.as_slice());
        }
        prop_assert_eq!(rewrite(&file).to_bytes(), bytes);
    }
}

#[test]
fn nested_arrays_of_every_shape_round_trip() {
    let s = |v: &str| Value::String(v.into());
    let values = [
        Value::Array(vec![]),
        Value::Array(vec![Value::Array(vec![]), Value::Array(vec![Value::U8(1)])]),
        Value::Array(vec![
            Value::Array(vec![s("a"), s("b")]),
            Value::Array(vec![Value::F64(0.5)]),
            Value::Array(vec![Value::Array(vec![Value::Bool(true)])]),
        ]),
    ];
    let mut w = GgufWriter::new();
    for (i, v) in values.iter().enumerate() {
        w.add_metadata(format!("n.{i}"), v.clone()).unwrap();
    }
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    for (i, v) in values.iter().enumerate() {
        assert_eq!(file.get(&format!("n.{i}")), Some(v));
    }
}

#[test]
fn write_file_then_open_maps_the_same_content() {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("llama".into()))
        .unwrap();
    w.add_tensor("t", &[4], GgmlType::F32, vec![0u8; 16])
        .unwrap();
    w.add_tensor("e", &[0, 3], GgmlType::Q4_K, vec![]).unwrap();
    let path = std::env::temp_dir().join(format!("ds4-gguf-rt-{}.gguf", std::process::id()));
    w.write_file(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.as_bytes(), w.to_bytes().as_slice());
    assert_eq!(file.architecture().unwrap(), "llama");
    assert_eq!(
        file.tensors(),
        [
            TensorInfo {
                name: "t".into(),
                dims: vec![4],
                dtype: GgmlType::F32,
                offset: 0
            },
            TensorInfo {
                name: "e".into(),
                dims: vec![0, 3],
                dtype: GgmlType::Q4_K,
                offset: 32
            }
        ]
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn writer_rejects_what_the_reader_would() {
    use ds4_gguf::GgufError;
    let mut w = GgufWriter::new();
    w.add_metadata("k", Value::U8(1)).unwrap();
    assert!(matches!(
        w.add_metadata("k", Value::U8(2)),
        Err(GgufError::DuplicateKey { .. })
    ));
    assert_eq!(
        w.set_metadata("k", Value::U8(3)).unwrap(),
        Some(Value::U8(1))
    );
    assert!(matches!(
        w.add_metadata("m", Value::Array(vec![Value::U8(1), Value::I8(1)])),
        Err(GgufError::MixedArray { .. })
    ));
    let mut deep = Value::U8(0);
    for _ in 0..=ds4_gguf::MAX_ARRAY_NESTING {
        deep = Value::Array(vec![deep]);
    }
    assert!(matches!(
        w.add_metadata("d", deep),
        Err(GgufError::NestingTooDeep { .. })
    ));
    assert!(matches!(
        w.set_alignment(24),
        Err(GgufError::BadAlignment { .. })
    ));
    assert!(matches!(
        w.add_metadata("general.alignment", Value::U64(32)),
        Err(GgufError::BadAlignment { .. })
    ));
    assert!(matches!(
        w.add_tensor("q", &[33], GgmlType::Q4_0, vec![]),
        Err(GgufError::RowNotBlockMultiple { .. })
    ));
    assert!(matches!(
        w.add_tensor("f", &[2], GgmlType::F32, vec![0; 7]),
        Err(GgufError::TensorDataSize {
            expected: 8,
            got: 7,
            ..
        })
    ));
    w.add_tensor("f", &[2], GgmlType::F32, vec![0; 8]).unwrap();
    assert!(matches!(
        w.add_tensor("f", &[2], GgmlType::F32, vec![0; 8]),
        Err(GgufError::DuplicateTensor { .. })
    ));
    assert!(matches!(
        w.add_tensor("x".repeat(65), &[1], GgmlType::F32, vec![0; 4]),
        Err(GgufError::NameTooLong { .. })
    ));
    // What was rejected left no trace.
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(file.metadata().keys().collect::<Vec<_>>(), ["k"]);
    assert_eq!(file.tensors().len(), 1);
}
