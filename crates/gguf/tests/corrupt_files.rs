//! Malformed files, built byte by byte, each rejected with the error that names its fault.

use ds4_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, MAX_ARRAY_NESTING, Value};

/// A GGUF byte builder that writes whatever it is told, valid or not.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut r = Raw::default();
        r.bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).bytes(s)
    }
    /// A metadata entry with a raw value.
    fn kv(&mut self, key: &str, type_id: u32, value: &[u8]) -> &mut Self {
        self.str(key.as_bytes()).u32(type_id).bytes(value)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> &mut Self {
        self.str(name.as_bytes()).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(type_id).u64(offset)
    }
    fn pad(&mut self, alignment: usize) -> &mut Self {
        while !self.0.len().is_multiple_of(alignment) {
            self.0.push(0);
        }
        self
    }
    fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    fn parse(&self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0.clone())
    }
}

/// Two F32 tensors of 8 elements (32 bytes each), well placed: a valid file.
fn two_tensors(offset_b: u64) -> Raw {
    let mut r = Raw::header(3, 2, 1);
    r.kv(
        "general.architecture",
        8,
        &[&5u64.to_le_bytes()[..], b"llama"].concat(),
    )
    .tensor("a", &[8], 0, 0)
    .tensor("b", &[8], 0, offset_b)
    .pad(32)
    .zeros(64);
    r
}

macro_rules! assert_err {
    ($result:expr, $pattern:pat) => {
        match $result {
            Err(e @ $pattern) => e,
            Err(other) => panic!("expected {}, got: {other}", stringify!($pattern)),
            Ok(_) => panic!("expected {}, got Ok", stringify!($pattern)),
        }
    };
}

#[test]
fn valid_baseline_parses() {
    let file = two_tensors(32).parse().unwrap();
    assert_eq!(file.tensors().len(), 2);
    assert_eq!(file.tensor_data(file.tensor("b").unwrap()).len(), 32);
}

#[test]
fn header_faults() {
    assert_err!(GgufFile::from_bytes(vec![]), GgufError::Truncated { .. });
    let mut bad = two_tensors(32);
    bad.0[..4].copy_from_slice(b"GGML");
    let e = assert_err!(bad.parse(), GgufError::BadMagic { .. });
    assert!(e.to_string().contains("<memory>"), "{e}");
    for version in [0, 1, 4, 0xFFFF_FFFF] {
        assert_err!(
            Raw::header(version, 0, 0).parse(),
            GgufError::UnsupportedVersion { .. }
        );
    }
    assert_err!(
        Raw::header(3u32.swap_bytes(), 0, 0).parse(),
        GgufError::BigEndian { version: 3, .. }
    );
    // Version 2 has the same little-endian layout.
    assert_eq!(Raw::header(2, 0, 0).parse().unwrap().version(), 2);
    // Truncated inside the header.
    assert_err!(
        GgufFile::from_bytes(Raw::header(3, 0, 0).0[..20].to_vec()),
        GgufError::Truncated { .. }
    );
}

#[test]
fn every_truncation_is_an_error() {
    let full = two_tensors(32).0;
    for len in 0..full.len() {
        assert!(
            GgufFile::from_bytes(full[..len].to_vec()).is_err(),
            "prefix of {len} bytes parsed"
        );
    }
}

#[test]
fn absurd_counts_are_rejected_before_allocating() {
    assert_err!(
        Raw::header(3, 0, u64::MAX).parse(),
        GgufError::CountTooLarge {
            count: u64::MAX,
            ..
        }
    );
    assert_err!(
        Raw::header(3, u64::MAX, 0).parse(),
        GgufError::CountTooLarge { .. }
    );
    let mut r = Raw::header(3, 0, 1);
    r.kv(
        "k",
        9,
        &[&0u32.to_le_bytes()[..], &u64::MAX.to_le_bytes()].concat(),
    );
    assert_err!(r.parse(), GgufError::CountTooLarge { .. });
    // An array of 10 strings needs at least 80 bytes.
    let mut r = Raw::header(3, 0, 1);
    r.kv(
        "k",
        9,
        &[&8u32.to_le_bytes()[..], &10u64.to_le_bytes()].concat(),
    )
    .zeros(79);
    assert_err!(r.parse(), GgufError::CountTooLarge { max: 9, .. });
    // A string length past the end.
    let mut r = Raw::header(3, 0, 1);
    r.kv("k", 8, &(1u64 << 40).to_le_bytes());
    assert_err!(
        r.parse(),
        GgufError::Truncated {
            needed: 1_099_511_627_776,
            ..
        }
    );
}

#[test]
fn metadata_value_count_is_bounded() {
    let n = ds4_gguf::MAX_METADATA_VALUES + 1;
    let mut r = Raw::header(3, 0, 1);
    r.kv(
        "big",
        9,
        &[&0u32.to_le_bytes()[..], &n.to_le_bytes()].concat(),
    )
    .zeros(n as usize);
    assert_err!(r.parse(), GgufError::MetadataTooLarge { .. });
}

#[test]
fn metadata_faults() {
    let mut r = Raw::header(3, 0, 1);
    r.kv("k", 13, &[0]);
    assert_err!(r.parse(), GgufError::UnknownValueType { type_id: 13, .. });
    let mut r = Raw::header(3, 0, 1);
    r.kv(
        "k",
        9,
        &[&77u32.to_le_bytes()[..], &0u64.to_le_bytes()].concat(),
    );
    assert_err!(r.parse(), GgufError::UnknownValueType { type_id: 77, .. });
    let mut r = Raw::header(3, 0, 1);
    r.str(b"\xff\xfe").u32(0).bytes(&[1]);
    assert_err!(r.parse(), GgufError::InvalidUtf8 { .. });
    let mut r = Raw::header(3, 0, 1);
    r.kv("k", 7, &[2]);
    assert_err!(r.parse(), GgufError::InvalidBool { byte: 2, .. });
    let mut r = Raw::header(3, 0, 2);
    r.kv("k", 0, &[1]).kv("k", 0, &[2]);
    let e = assert_err!(r.parse(), GgufError::DuplicateKey { .. });
    assert!(e.to_string().contains("'k'"), "{e}");
}

/// A value of `depth` nested arrays around one u8.
fn nested(depth: usize) -> Raw {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"n").u32(9);
    for _ in 1..depth {
        r.u32(9).u64(1);
    }
    r.u32(0).u64(1).bytes(&[7]);
    r
}

#[test]
fn nesting_is_bounded() {
    let file = nested(MAX_ARRAY_NESTING).parse().unwrap();
    let mut v = file.get("n").unwrap();
    for _ in 1..MAX_ARRAY_NESTING {
        v = &v.as_array().unwrap()[0];
    }
    assert_eq!(v, &Value::Array(vec![Value::U8(7)]));
    assert_err!(
        nested(MAX_ARRAY_NESTING + 1).parse(),
        GgufError::NestingTooDeep { .. }
    );
    // Deep nesting far past the bound must not overflow the stack either.
    assert_err!(nested(100_000).parse(), GgufError::NestingTooDeep { .. });
}

#[test]
fn alignment_faults() {
    for (type_id, value) in [
        (4u32, 0u32.to_le_bytes().to_vec()),
        (4, 48u32.to_le_bytes().to_vec()),
    ] {
        let mut r = Raw::header(3, 0, 1);
        r.kv("general.alignment", type_id, &value);
        assert_err!(r.parse(), GgufError::BadAlignment { .. });
    }
    let mut r = Raw::header(3, 0, 1);
    r.kv("general.alignment", 10, &64u64.to_le_bytes());
    assert_err!(r.parse(), GgufError::BadAlignment { .. });
}

#[test]
fn tensor_info_faults() {
    let one = |name: &str, dims: &[u64], type_id: u32| {
        let mut r = Raw::header(3, 1, 0);
        r.tensor(name, dims, type_id, 0).pad(32).zeros(4096);
        r.parse()
    };
    assert!(one("ok", &[32, 2], GgmlType::Q4_0 as u32).is_ok());
    assert_err!(
        one("t", &[1; 5], 0),
        GgufError::TooManyDims { n_dims: 5, .. }
    );
    assert_err!(
        one(&"x".repeat(65), &[1], 0),
        GgufError::NameTooLong { len: 65, .. }
    );
    assert!(one(&"x".repeat(64), &[1], 0).is_ok());
    for id in [4, 5, 31, 40, u32::MAX] {
        assert_err!(one("t", &[1], id), GgufError::UnknownTensorType { .. });
    }
    let e = assert_err!(
        one("big", &[1 << 32, 1 << 32], 0),
        GgufError::DimsOverflow { .. }
    );
    assert!(e.to_string().contains("'big'"), "{e}");
    assert_err!(one("t", &[u64::MAX], 24), GgufError::DimsOverflow { .. });
    assert_err!(
        one("t", &[33], GgmlType::Q4_0 as u32),
        GgufError::RowNotBlockMultiple {
            row: 33,
            block: 32,
            ..
        }
    );
    assert_err!(
        one("t", &[100], GgmlType::Q4_K as u32),
        GgufError::RowNotBlockMultiple { block: 256, .. }
    );
}

#[test]
fn duplicate_tensor_names() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("w", &[8], 0, 0)
        .tensor("w", &[8], 0, 32)
        .pad(32)
        .zeros(64);
    assert_err!(r.parse(), GgufError::DuplicateTensor { .. });
}

#[test]
fn placement_faults() {
    assert_err!(
        two_tensors(16).parse(),
        GgufError::MisalignedOffset {
            offset: 16,
            alignment: 32,
            ..
        }
    );
    assert_err!(two_tensors(64).parse(), GgufError::OffsetOutOfRange { .. });
    assert_err!(
        two_tensors(u64::MAX - 31).parse(),
        GgufError::OffsetOutOfRange { .. }
    );
    let e = assert_err!(two_tensors(0).parse(), GgufError::OverlappingTensors { .. });
    assert!(
        e.to_string().contains("'a'") && e.to_string().contains("'b'"),
        "{e}"
    );
    // Out-of-order but disjoint tensors are fine.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("late", &[8], 0, 32)
        .tensor("early", &[8], 0, 0)
        .pad(32)
        .zeros(64);
    assert!(r.parse().is_ok());
    // Zero-sized tensors overlap nothing.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("empty", &[0], 0, 0)
        .tensor("a", &[8], 0, 0)
        .pad(32)
        .zeros(32);
    assert!(r.parse().is_ok());
    // Tensors, but the file ends before the padded data section.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("a", &[0], 0, 0);
    assert_err!(r.parse(), GgufError::DataSectionMissing { .. });
}

#[test]
fn vocabulary_only_files_need_no_padding() {
    let mut r = Raw::header(3, 0, 1);
    r.kv("k", 0, &[1]);
    assert_ne!(r.0.len() % 32, 0);
    assert_eq!(r.parse().unwrap().get("k"), Some(&Value::U8(1)));
}

#[test]
fn errors_from_open_name_the_path_and_tensor() {
    let dir = std::env::temp_dir().join(format!("ds4-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("overlap.gguf");
    std::fs::write(&path, &two_tensors(0).0).unwrap();
    let e = GgufFile::open(&path).unwrap_err();
    let message = e.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("'b'"), "{message}");
    let missing = GgufFile::open(&dir.join("absent.gguf")).unwrap_err();
    assert!(matches!(missing, GgufError::Io { .. }), "{missing}");
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&empty),
        Err(GgufError::Truncated { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn typed_getters_report_missing_and_wrong_types() {
    let mut w = GgufWriter::new();
    w.add_metadata("n", Value::U64(1 << 40)).unwrap();
    w.add_metadata("s", Value::String("x".into())).unwrap();
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(file.get_u64("n").unwrap(), 1 << 40);
    let e = assert_err!(file.get_u32("n"), GgufError::WrongType { .. });
    assert_eq!(
        e.to_string(),
        "<memory>: metadata key 'n' is u64 1099511627776, expected an integer that fits u32"
    );
    assert_err!(file.get_str("absent"), GgufError::MissingKey { .. });
    assert_err!(file.get_arr_str("s"), GgufError::WrongType { .. });
    assert_eq!(file.get_opt::<u32>("absent").unwrap(), None);
    assert_err!(file.require_tensor("w"), GgufError::MissingTensor { .. });
}

#[test]
fn typed_views_need_alignment() {
    // With alignment 1, an f32 tensor after a k-byte i8 tensor sits at data_offset + k; the
    // header size does not depend on k, so pick k to make that address odd for f32.
    let build = |k: usize| {
        let mut w = GgufWriter::new();
        w.set_alignment(1).unwrap();
        w.add_tensor("pad", &[k as u64], GgmlType::I8, vec![1; k])
            .unwrap();
        w.add_tensor("f", &[1], GgmlType::F32, 2.5f32.to_le_bytes())
            .unwrap();
        GgufFile::from_bytes(w.to_bytes()).unwrap()
    };
    let data_offset = build(1).data_offset() as usize;
    let k = if (data_offset + 1).is_multiple_of(4) {
        2
    } else {
        1
    };
    let file = build(k);
    let f = file.require_tensor("f").unwrap();
    assert_eq!(f.offset, k as u64);
    assert_eq!(file.tensor_data(f), 2.5f32.to_le_bytes());
    assert_err!(
        file.tensor_as::<f32>(f),
        GgufError::TensorDataMisaligned { .. }
    );
    let pad = file.require_tensor("pad").unwrap();
    assert_eq!(file.tensor_as::<i8>(pad).unwrap(), vec![1; k]);
    // A hand-made info outside the file gives an empty slice or an error, not a panic.
    let foreign = ds4_gguf::TensorInfo {
        offset: 1 << 40,
        ..f.clone()
    };
    assert!(file.tensor_data(&foreign).is_empty());
    assert_err!(
        file.tensor_as::<f32>(&foreign),
        GgufError::OffsetOutOfRange { .. }
    );
}

#[test]
fn gguf_file_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<GgufFile>();
    assert_send_sync::<GgufWriter>();
}
