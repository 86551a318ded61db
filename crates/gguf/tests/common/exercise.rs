//! Parses arbitrary bytes and, when they are accepted, uses every accessor and checks the
//! promises of an accepted file. Shared by the mutation tests and the cargo-fuzz target
//! (`fuzz/fuzz_targets/parse.rs` includes this file), so it uses only `ds4_gguf`.

use ds4_gguf::{GgufFile, GgufWriter};

/// Returns whether `bytes` were accepted. Panics only if an accepted file breaks a promise.
pub fn exercise(bytes: &[u8]) -> bool {
    let Ok(file) = GgufFile::from_bytes(bytes.to_vec()) else {
        return false;
    };
    let mut again = GgufWriter::new();
    for (key, value) in file.metadata() {
        // The same entry (values may hold NaN, which is unequal to itself).
        assert!(
            file.get(key)
                .is_some_and(|found| std::ptr::eq(found, value))
        );
        let _ = value.describe();
        let _ = file.get_as::<Vec<String>>(key);
        let _ = file.get_as::<u32>(key);
        again
            .add_metadata(key, value.clone())
            .expect("accepted metadata is writable");
    }
    for t in file.tensors() {
        let data = file.tensor_data(t);
        assert_eq!(data.len() as u64, t.n_bytes());
        assert_eq!(t.offset % file.alignment(), 0);
        assert_eq!(file.tensor(&t.name), Some(t));
        let _ = file.tensor_as::<f32>(t);
        let _ = file.tensor_as::<half::f16>(t);
        let _ = file.tensor_as::<i8>(t);
        again
            .add_tensor(t.name.clone(), &t.dims, t.dtype, data)
            .expect("an accepted tensor is writable");
    }
    // What was accepted, written again, reads back to the same bytes when rewritten.
    let written = again.to_bytes();
    let reread = GgufFile::from_bytes(written.clone()).expect("a rewritten file reads back");
    assert_eq!(reread.metadata().len(), file.metadata().len());
    assert_eq!(reread.tensors().len(), file.tensors().len());
    let mut third = GgufWriter::new();
    for (key, value) in reread.metadata() {
        third.add_metadata(key, value.clone()).unwrap();
    }
    for t in reread.tensors() {
        third
            .add_tensor(t.name.clone(), &t.dims, t.dtype, reread.tensor_data(t))
            .unwrap();
    }
    assert_eq!(third.to_bytes(), written);
    true
}
