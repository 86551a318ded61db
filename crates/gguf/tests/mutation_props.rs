//! Corrupted files never panic: valid files (from `GgufWriter`, from gguf-py, and the
//! vocabulary fixtures cut to 4 KiB) are truncated and mutated, and parsing must return
//! `Ok` or `Err`; accepted files must keep every promise (see `common/exercise.rs`).
//! `PROPTEST_CASES=100000 cargo test -p ds4-gguf --release --test mutation_props` runs longer.

mod common;

use common::{arb, exercise::exercise};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use std::io::Read;
use std::sync::OnceLock;

/// `$PROPTEST_CASES`, else 512.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(512)
}

/// One edit of a file's bytes; positions are scaled to the length.
#[derive(Debug, Clone)]
enum Mutation {
    Truncate(Index),
    SetByte(Index, u8),
    SetU32(Index, u32),
    SetU64(Index, u64),
    Insert(Index, Vec<u8>),
    Remove(Index, usize),
}

/// Numbers that hit edge cases in counts, lengths, offsets and type ids.
fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        0u64..70,
        Just(u64::MAX),
        Just(u64::MAX - 31),
        Just(i64::MAX as u64),
        Just(1 << 32),
        Just(1 << 24),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::SetByte(i, b)),
        (any::<Index>(), interesting_u64()).prop_map(|(i, v)| Mutation::SetU32(i, v as u32)),
        (any::<Index>(), interesting_u64()).prop_map(|(i, v)| Mutation::SetU64(i, v)),
        (any::<Index>(), vec(any::<u8>(), 1..16)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<Index>(), 1usize..16).prop_map(|(i, n)| Mutation::Remove(i, n)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    let len = bytes.len();
    let put = |bytes: &mut Vec<u8>, i: &Index, value: &[u8]| {
        let at = i.index(len);
        let n = value.len().min(len - at);
        bytes[at..at + n].copy_from_slice(&value[..n]);
    };
    match m {
        Mutation::Truncate(i) => bytes.truncate(i.index(len)),
        Mutation::SetByte(i, b) => put(bytes, i, &[*b]),
        Mutation::SetU32(i, v) => put(bytes, i, &v.to_le_bytes()),
        Mutation::SetU64(i, v) => put(bytes, i, &v.to_le_bytes()),
        Mutation::Insert(i, b) => {
            let at = i.index(len);
            bytes.splice(at..at, b.iter().copied());
        }
        Mutation::Remove(i, n) => {
            let at = i.index(len);
            bytes.drain(at..(at + n).min(len));
        }
    }
}

/// The gguf-py file and the first 4 KiB of each vocabulary fixture (if present).
fn fixed_seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(load_seeds)
}

fn load_seeds() -> Vec<Vec<u8>> {
    let mut seeds = vec![include_bytes!("data/gguf_py_all_types.bin").to_vec()];
    // Without the fixtures the properties run on the built-in seed alone.
    let Some(dir) = ds4_testkit::fixture("tokenizer") else {
        return seeds;
    };
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "gguf") {
            let mut prefix = Vec::with_capacity(4096);
            let file = std::fs::File::open(&path).unwrap();
            file.take(4096).read_to_end(&mut prefix).unwrap();
            seeds.push(prefix);
        }
    }
    seeds
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn mutated_writer_files_never_panic(
        content in arb::content(),
        mutations in vec(mutation(), 1..5),
    ) {
        let mut bytes = content.writer().to_bytes();
        prop_assert!(exercise(&bytes), "the unmutated file must parse");
        for m in &mutations {
            apply(&mut bytes, m);
            exercise(&bytes);
        }
    }

    #[test]
    fn mutated_fixture_files_never_panic(
        seed in any::<Index>(),
        mutations in vec(mutation(), 1..8),
    ) {
        let mut bytes = seed.get(fixed_seeds()).clone();
        for m in &mutations {
            apply(&mut bytes, m);
            exercise(&bytes);
        }
    }
}

#[test]
fn every_prefix_of_the_gguf_py_file_is_handled() {
    let full = include_bytes!("data/gguf_py_all_types.bin");
    for len in 0..full.len() {
        // Prefixes that end inside tensor data are rejected; none may panic.
        assert!(!exercise(&full[..len]) || len >= 1088 + 256 + 8, "{len}");
    }
    assert!(exercise(full));
}

#[test]
fn fuzz_corpus_replays_without_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/parse");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        exercise(&std::fs::read(entry.path()).unwrap());
        n += 1;
    }
    assert!(n > 0, "empty corpus at {}", dir.display());
}
