//! Golden-master test of the sampler against antirez/ds4's own sampler.
//!
//! Fixture: `sampler/` under `$DS4_FIXTURES` (default `<workspace>/../shared/fixtures`),
//! made by compiling ds4.c's sampling functions unchanged (commit 8d576642). Each case
//! gives 32 consecutive draws from one logits row with one carried RNG state; every id and
//! every RNG state after each draw must match exactly. `rng_vectors.json` checks the RNG
//! alone (state, raw output, 24-bit uniform and its f32 bits).

use ds4_engine::sampler::{Rng, Sampler, SamplerParams, sample};
use serde_json::Value;
use std::path::PathBuf;

fn read_json(path: &PathBuf) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn u64_field(v: &Value) -> u64 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a u64 string: {v}"))
}

fn hex_u32(v: &Value) -> u32 {
    let s = v.as_str().unwrap_or_else(|| panic!("not a string: {v}"));
    u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn read_logits(dir: &std::path::Path, file: &str, n_vocab: usize) -> Vec<f32> {
    let bytes = std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    assert_eq!(bytes.len(), n_vocab * 4, "{file}: size");
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Parameters of one named setting, taken from the exact binary32 bit patterns.
fn setting_params(doc: &Value, name: &str) -> SamplerParams {
    let s = doc["settings"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == name))
        .unwrap_or_else(|| panic!("setting {name} not found"));
    let params = SamplerParams {
        temperature: f32::from_bits(hex_u32(&s["temperature_f32_bits"])),
        top_k: s["top_k"].as_i64().expect("top_k") as i32,
        top_p: f32::from_bits(hex_u32(&s["top_p_f32_bits"])),
        min_p: f32::from_bits(hex_u32(&s["min_p_f32_bits"])),
    };
    // The decimals round to the same f32s.
    assert_eq!(
        params.temperature,
        s["temperature"].as_f64().unwrap() as f32
    );
    assert_eq!(params.top_p, s["top_p"].as_f64().unwrap() as f32);
    assert_eq!(params.min_p, s["min_p"].as_f64().unwrap() as f32);
    params
}

#[test]
fn sampler_cases_match_ds4() {
    let Some(dir) = ds4_testkit::fixture("sampler") else {
        return;
    };
    let doc = read_json(&dir.join("sampler_cases.json"));
    let cases = doc["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    let mut rows: std::collections::HashMap<String, Vec<f32>> = Default::default();
    let mut failures = Vec::new();
    for case in cases {
        let id = case["id"].as_str().expect("id");
        let file = case["logits_file"].as_str().expect("logits_file");
        let n_vocab = case["n_vocab"].as_u64().expect("n_vocab") as usize;
        let logits = rows
            .entry(file.to_string())
            .or_insert_with(|| read_logits(&dir, file, n_vocab));
        let params = setting_params(&doc, case["setting"].as_str().expect("setting"));
        assert_eq!(params.top_k as i64, case["top_k"].as_i64().unwrap(), "{id}");
        let seed = u64_field(&case["initial_rng_state"]);
        let want_ids: Vec<u32> = case["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_u64().expect("id") as u32)
            .collect();
        let want_states: Vec<u64> = case["rng_state_after_each_draw"]
            .as_array()
            .expect("states")
            .iter()
            .map(u64_field)
            .collect();
        assert_eq!(want_ids.len(), 32, "{id}");

        // The free function and the scratch-reusing Sampler must agree with the fixture.
        let mut rng = Rng(seed);
        let mut sampler = Sampler::new(params, seed);
        let failures_before = failures.len();
        for (draw, (&want_id, &want_state)) in want_ids.iter().zip(&want_states).enumerate() {
            let got = sample(logits, &params, &mut rng);
            let got_s = sampler.sample(logits);
            if got != want_id || rng.0 != want_state || got_s != got || sampler.rng != rng {
                failures.push(format!(
                    "{id} draw {draw}: id {got} (Sampler {got_s}) want {want_id}, \
                     state {} want {want_state}",
                    rng.0
                ));
                break;
            }
        }
        if failures.len() == failures_before {
            assert_eq!(
                rng.0,
                u64_field(&case["final_rng_state"]),
                "{id}: final state"
            );
        }
    }
    assert!(
        failures.is_empty(),
        "{} failing cases:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn rng_vectors_match_ds4() {
    let Some(dir) = ds4_testkit::fixture("sampler") else {
        return;
    };
    let doc = read_json(&dir.join("rng_vectors.json"));
    let seeds = doc["seeds"].as_array().expect("seeds");
    assert!(!seeds.is_empty());
    for s in seeds {
        let seed = u64_field(&s["seed"]);
        let mut raw = Rng(seed);
        let mut uni = Rng(seed);
        for (i, step) in s["steps"].as_array().expect("steps").iter().enumerate() {
            let out = raw.next_u64();
            assert_eq!(
                raw.0,
                u64_field(&step["state_after"]),
                "seed {seed} step {i}: state"
            );
            assert_eq!(
                out,
                u64_field(&step["output"]),
                "seed {seed} step {i}: output"
            );
            assert_eq!(
                (out >> 40) & 0xFF_FFFF,
                step["u24"].as_u64().unwrap(),
                "seed {seed} step {i}"
            );
            let u = uni.next_f32();
            assert_eq!(
                u.to_bits(),
                hex_u32(&step["f32_bits"]),
                "seed {seed} step {i}: f32"
            );
        }
    }
}
