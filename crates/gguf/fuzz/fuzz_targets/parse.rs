//! Fuzz target: arbitrary bytes through `GgufFile::from_bytes`; accepted files go through
//! every accessor and a write/read round trip (the shared `tests/common/exercise.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/common/exercise.rs"]
mod exercise;

fuzz_target!(|data: &[u8]| {
    exercise::exercise(data);
});
