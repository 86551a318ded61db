//! Token sampler with antirez/ds4 semantics.
//!
//! Follows `ds4.c` at commit 8d576642c39b9a2d782a80159ba84ef5a81c0b81
//! (`sample_top_p_min_p`, `sample_full_vocab`, `sample_argmax`, and the xorshift64* RNG
//! `sample_rng_next` / `sample_rng_f32`), bit for bit: every float is an `f32`, sums are
//! sequential `f32` sums in the reference's order, `exp` is the C library's `expf` (Rust's
//! [`f32::exp`] links glibc's `expf` on linux-gnu), equal logits keep increasing id order,
//! and every non-greedy call that reaches a draw consumes exactly one RNG step.
//!
//! Input: one logits row of `n_vocab` values, index = token id. NaN and ±inf logits are
//! never sampled by the sampling paths (the greedy path can pick `+inf`, as ds4's does).
//!
//! Paths, as ds4 dispatches them:
//! * `temperature <= 0`: greedy argmax (lowest id among tied maxima), RNG untouched.
//! * `top_k <= 0`, `top_p >= 1`: linear walk over the full vocabulary in id order, with
//!   min-p relative to the top token.
//! * `top_k <= 0`, `top_p < 1`: nucleus over the full vocabulary sorted by logit
//!   (descending, ties by id ascending), with min-p.
//! * `top_k > 0`: the top `min(top_k, 1024, n_vocab)` finite logits, then the same
//!   min-p / top-p filter and draw as the nucleus path.
//!
//! Speed: the sorted paths never sort the whole vocabulary. The candidates are ordered by
//! a total order (logit descending, then id ascending), so a selection of the best `m`
//! followed by a sort of those `m` gives exactly the prefix a full stable sort would give;
//! the prefix is extended geometrically only while the nucleus walk needs more of it.

/// The most candidates the top-k path keeps (ds4 caps `top_k` at this value).
pub const TOP_K_MAX: usize = 1024;

/// First length of the lazily sorted candidate prefix (sorted paths); doubled on demand.
const FIRST_SORTED_CHUNK: usize = 256;

/// Sampling parameters; all floats are `f32`, as in ds4.
///
/// Out-of-range values are normalised the way ds4 does it: `top_p <= 0` or `top_p > 1`
/// means 1, `min_p < 0` means 0, `top_k > 1024` means 1024, `top_k <= 0` means "whole
/// vocabulary". `temperature <= 0` selects greedy argmax.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerParams {
    /// Softmax temperature; `<= 0` means greedy.
    pub temperature: f32,
    /// Keep only the `top_k` largest logits (`<= 0`: no top-k; capped at [`TOP_K_MAX`]).
    pub top_k: i32,
    /// Nucleus threshold on cumulative probability, in `(0, 1]`; 1 disables it.
    pub top_p: f32,
    /// Minimum probability relative to the most likely token, in `[0, 1]`; 0 disables it.
    pub min_p: f32,
}

impl SamplerParams {
    /// Greedy decoding: argmax, the RNG is never used.
    pub const GREEDY: Self = Self {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
    };

    /// The defaults of ds4's CLI and server: temperature 1, top_p 1, min_p 0.05, no top-k.
    /// This takes ds4's cheapest sampling path (linear walk, no sort).
    pub const DS4_DEFAULT: Self = Self {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.05,
    };

    /// True when these parameters select greedy argmax (`temperature <= 0`).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

impl Default for SamplerParams {
    /// ds4's CLI defaults, [`SamplerParams::DS4_DEFAULT`].
    fn default() -> Self {
        Self::DS4_DEFAULT
    }
}

/// ds4's xorshift64* random number generator; the field is the raw state.
///
/// A state of 0 is replaced by [`Rng::ZERO_STATE_SUBSTITUTE`] on the next step, so seeds 0
/// and `0x9E3779B97F4A7C15` give the same sequence. (ds4's CLI maps a user seed of 0 to a
/// clock-derived seed before it gets here; this type does not.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rng(pub u64);

impl Rng {
    /// The state used in place of a zero state.
    pub const ZERO_STATE_SUBSTITUTE: u64 = 0x9E37_79B9_7F4A_7C15;
    /// The xorshift64* output multiplier.
    pub const OUTPUT_MULTIPLIER: u64 = 0x2545_F491_4F6C_DD1D;

    /// An RNG whose state starts at `seed` (taken literally, 0 included).
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The current state.
    pub fn state(&self) -> u64 {
        self.0
    }

    /// One xorshift64* step (`sample_rng_next`): advances the state and returns the
    /// multiplied output.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        if x == 0 {
            x = Self::ZERO_STATE_SUBSTITUTE;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(Self::OUTPUT_MULTIPLIER)
    }

    /// One step converted to a uniform `f32` in `[0, 1)` from the top 24 bits of the output
    /// (`sample_rng_f32`); the result is an exact multiple of 2^-24.
    pub fn next_f32(&mut self) -> f32 {
        let bits = (self.next_u64() >> 40) & 0x00FF_FFFF;
        // Exact: a 24-bit integer fits the f32 mantissa, and the division is by a power of 2.
        bits as f32 / 16_777_216.0
    }
}

/// A reusable sampler: parameters, RNG state and scratch memory.
///
/// [`Sampler::sample`] gives the same ids as the free function [`sample`] but reuses its
/// scratch buffers (up to 12 bytes per vocabulary entry) from call to call.
#[derive(Debug, Clone)]
pub struct Sampler {
    /// The sampling parameters used by every call.
    pub params: SamplerParams,
    /// The RNG, carried from call to call.
    pub rng: Rng,
    scratch: Scratch,
}

impl Sampler {
    /// A sampler with `params` and an RNG state starting at `seed` (taken literally).
    pub fn new(params: SamplerParams, seed: u64) -> Self {
        Self {
            params,
            rng: Rng::new(seed),
            scratch: Scratch::default(),
        }
    }

    /// A greedy (argmax) sampler; its RNG is never used.
    pub fn greedy() -> Self {
        Self::new(SamplerParams::GREEDY, 0)
    }

    /// Samples one token id from `logits` (length `n_vocab`); see [`sample`].
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        sample_with_scratch(logits, &self.params, &mut self.rng, &mut self.scratch)
    }
}

/// Samples one token id from a logits row (`logits[id]`, length `n_vocab`), ds4's
/// `sample_top_p_min_p`.
///
/// Consumes exactly one RNG step unless the call is greedy, or no finite logit exists, or
/// the probability mass is not a positive finite number (then it returns the best token
/// without drawing, as ds4 does). Never panics; an empty row gives id 0.
pub fn sample(logits: &[f32], params: &SamplerParams, rng: &mut Rng) -> u32 {
    sample_with_scratch(logits, params, rng, &mut Scratch::default())
}

/// Working memory of one call.
#[derive(Debug, Clone, Default)]
struct Scratch {
    /// Rank keys (see [`rank_key`]) of the candidates of a sorted path.
    keys: Vec<u64>,
    /// Unnormalised probabilities indexed by token id (only candidates' entries are read).
    probs: Vec<f32>,
}

/// Sort key of a finite logit: ascending keys order candidates by logit descending, then
/// by id ascending; the id is the low 32 bits.
///
/// Every candidate has a distinct key, so any correct sort or selection of keys gives the
/// order of ds4's stable sort of an id-ordered array by logit. `-0.0` and `0.0` get the
/// same logit part, since C's `<` and `>` treat them as equal.
fn rank_key(logit: f32, id: u32) -> u64 {
    let v = if logit == 0.0 { 0.0f32 } else { logit };
    let bits = v.to_bits();
    // Monotone map of f32 order onto u32 order, then inverted for "descending".
    let ascending = if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    };
    (u64::from(!ascending) << 32) | u64::from(id)
}

/// The token id of a rank key.
fn key_id(key: u64) -> u32 {
    key as u32
}

fn sample_with_scratch(
    logits: &[f32],
    params: &SamplerParams,
    rng: &mut Rng,
    scratch: &mut Scratch,
) -> u32 {
    if params.temperature <= 0.0 {
        return argmax(logits);
    }
    let top_p = if params.top_p <= 0.0 || params.top_p > 1.0 {
        1.0
    } else {
        params.top_p
    };
    // ds4 maps min_p < 0 to 0; a NaN min_p filters nothing on every ds4 path, like 0.
    let min_p = if params.min_p > 0.0 {
        params.min_p
    } else {
        0.0
    };
    scratch.keys.clear();
    if scratch.probs.len() < logits.len() {
        scratch.probs.resize(logits.len(), 0.0);
    }
    if params.top_k <= 0 {
        sample_full_vocab(logits, params.temperature, top_p, min_p, rng, scratch)
    } else {
        sample_top_k(logits, params, top_p, min_p, rng, scratch)
    }
}

/// Greedy argmax (`sample_argmax`): the lowest id whose value is strictly greatest and
/// above -1e30; 0 when none is. NaN and `-inf` never win, `+inf` does.
///
/// Two passes that vectorize (a decode step's logits row, 155k values for GLM-5.3, took
/// 130 µs one value at a time, a sixtieth of the step): the maximum over 32 lanes, then
/// the first block of 32 holding it and its first position there. `f32::max` skips NaN,
/// and `==` finds either zero when the maximum is a zero, as `>` kept the first.
pub fn argmax(logits: &[f32]) -> u32 {
    const FLOOR: f32 = -1e30;
    const LANES: usize = 32;
    let blocks = logits.chunks_exact(LANES);
    let mut m = [FLOOR; LANES];
    for b in blocks.clone() {
        for (m, &v) in m.iter_mut().zip(b) {
            *m = m.max(v);
        }
    }
    let max = blocks
        .remainder()
        .iter()
        .chain(&m)
        .fold(FLOOR, |a, &v| a.max(v));
    // Never NaN: the folds start from FLOOR and `f32::max` skips NaN.
    if max <= FLOOR {
        return 0;
    }
    let mut start = 0;
    for b in blocks {
        if b.iter().fold(false, |hit, &v| hit | (v == max)) {
            break;
        }
        start += LANES;
    }
    logits[start..]
        .iter()
        .position(|&v| v == max)
        .map_or(0, |i| (start + i) as u32)
}

/// ds4's `sample_full_vocab` (`top_k <= 0`), with `top_p` and `min_p` normalised.
fn sample_full_vocab(
    logits: &[f32],
    temperature: f32,
    top_p: f32,
    min_p: f32,
    rng: &mut Rng,
    scratch: &mut Scratch,
) -> u32 {
    let mut max_logit = f32::NEG_INFINITY;
    let mut best = 0u32;
    let mut finite = 0usize;
    for (id, &v) in (0u32..).zip(logits) {
        if v.is_finite() {
            finite += 1;
            if v > max_logit {
                max_logit = v;
                best = id;
            }
        }
    }
    if finite == 0 {
        return argmax(logits);
    }
    let probs = &mut scratch.probs[..logits.len()];

    if top_p >= 1.0 {
        // Linear walk in id order; min_p is relative to the top token, whose weight is 1.
        let mut sum = 0.0f32;
        for (&v, p) in logits.iter().zip(probs.iter_mut()) {
            if v.is_finite() {
                *p = ((v - max_logit) / temperature).exp();
                // Adding +0.0 leaves the sum unchanged; the select avoids a data-dependent
                // branch. A NaN weight is kept, as by ds4's `if (p < min_rel) continue`.
                sum += if *p < min_p { 0.0 } else { *p };
            }
        }
        if sum <= 0.0 || !sum.is_finite() {
            return best;
        }
        let mut r = rng.next_f32() * sum;
        for (id, (&v, &p)) in (0u32..).zip(logits.iter().zip(probs.iter())) {
            if v.is_finite() && (p >= min_p || p.is_nan()) {
                r -= p;
                if r <= 0.0 {
                    return id;
                }
            }
        }
        return best;
    }

    // Nucleus: the mass is summed in id order over every finite token (min_p aside).
    let keys = &mut scratch.keys;
    keys.reserve(finite);
    let mut sum = 0.0f32;
    for (id, (&v, p)) in (0u32..).zip(logits.iter().zip(probs.iter_mut())) {
        if v.is_finite() {
            *p = ((v - max_logit) / temperature).exp();
            sum += *p;
            keys.push(rank_key(v, id));
        }
    }
    if sum <= 0.0 || !sum.is_finite() {
        return best;
    }
    let mut ranked = LazyRanking::new(keys);
    nucleus_draw(&mut ranked, probs, sum, top_p, min_p, rng)
}

/// ds4's top-k path of `sample_top_p_min_p` (`top_k > 0`), with `top_p` and `min_p`
/// normalised.
fn sample_top_k(
    logits: &[f32],
    params: &SamplerParams,
    top_p: f32,
    min_p: f32,
    rng: &mut Rng,
    scratch: &mut Scratch,
) -> u32 {
    let k = usize::try_from(params.top_k)
        .unwrap_or(TOP_K_MAX)
        .min(TOP_K_MAX)
        .min(logits.len());
    let keys = &mut scratch.keys;
    // The k smallest keys are exactly ds4's insertion-built list. Stream them through a
    // buffer of 2k: whenever it fills, keep its k best; a later key above the k-th kept
    // one can never enter (an equal logit has a larger id, hence a larger key).
    let capacity = 2 * k.max(1);
    let mut cutoff = u64::MAX;
    for (id, &v) in (0u32..).zip(logits) {
        if !v.is_finite() {
            continue;
        }
        let key = rank_key(v, id);
        if key > cutoff {
            continue;
        }
        keys.push(key);
        if keys.len() == capacity {
            keys.select_nth_unstable(k - 1);
            keys.truncate(k);
            cutoff = keys[k - 1];
        }
    }
    if keys.is_empty() {
        return argmax(logits);
    }
    if keys.len() > k {
        keys.select_nth_unstable(k);
        keys.truncate(k);
    }
    keys.sort_unstable();

    let probs = &mut scratch.probs[..logits.len()];
    let max_logit = logits[key_id(keys[0]) as usize];
    let mut sum = 0.0f32;
    for &key in keys.iter() {
        let id = key_id(key) as usize;
        probs[id] = ((logits[id] - max_logit) / params.temperature).exp();
        sum += probs[id];
    }
    if sum <= 0.0 || !sum.is_finite() {
        return key_id(keys[0]);
    }
    let mut ranked = LazyRanking::new(keys);
    nucleus_draw(&mut ranked, probs, sum, top_p, min_p, rng)
}

/// Candidate rank keys whose prefix is put in order on demand.
///
/// Invariant: `keys[..sorted]` holds the `sorted` smallest keys in ascending order, i.e.
/// exactly the first `sorted` entries of the fully sorted array.
struct LazyRanking<'a> {
    keys: &'a mut [u64],
    sorted: usize,
}

impl<'a> LazyRanking<'a> {
    fn new(keys: &'a mut [u64]) -> Self {
        Self { keys, sorted: 0 }
    }

    fn len(&self) -> usize {
        self.keys.len()
    }

    /// The token id of rank `i` (`i < len()`), extending the sorted prefix if needed.
    fn id(&mut self, i: usize) -> u32 {
        if i >= self.sorted {
            let n = self.keys.len();
            let target = (self.sorted * 2).max(FIRST_SORTED_CHUNK).max(i + 1).min(n);
            let rest = &mut self.keys[self.sorted..];
            let take = target - self.sorted;
            if take < rest.len() {
                rest.select_nth_unstable(take);
            }
            rest[..take].sort_unstable();
            self.sorted = target;
        }
        key_id(self.keys[i])
    }
}

/// The shared min-p / top-p filter and draw of ds4's sorted paths.
///
/// `probs[id]` is the unnormalised probability of each ranked candidate and `sum` the
/// total mass (positive, finite). Walks the ranked candidates, stopping before one below
/// `min_p` times the top probability and after the cumulative mass reaches `top_p`; then
/// draws once over the kept candidates.
fn nucleus_draw(
    ranked: &mut LazyRanking<'_>,
    probs: &[f32],
    sum: f32,
    top_p: f32,
    min_p: f32,
    rng: &mut Rng,
) -> u32 {
    let prob = |id: u32| probs[id as usize];
    let min_prob = (prob(ranked.id(0)) / sum) * min_p;
    let mut kept_sum = 0.0f32;
    let mut kept = 0usize;
    for i in 0..ranked.len() {
        let p = prob(ranked.id(i));
        if i > 0 && p / sum < min_prob {
            break;
        }
        kept_sum += p;
        kept += 1;
        if kept_sum / sum >= top_p {
            break;
        }
    }
    // `kept >= 1`: rank 0 is always kept.
    let mut r = rng.next_f32() * kept_sum;
    for i in 0..kept {
        let id = ranked.id(i);
        r -= prob(id);
        if r <= 0.0 {
            return id;
        }
    }
    ranked.id(kept - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering;

    fn params(temperature: f32, top_k: i32, top_p: f32, min_p: f32) -> SamplerParams {
        SamplerParams {
            temperature,
            top_k,
            top_p,
            min_p,
        }
    }

    #[test]
    fn rng_first_step_from_one_matches_hand_computation() {
        // x = 1: x ^= x>>12 -> 1; x ^= x<<25 -> 0x2000001; x ^= x>>27 -> 0x2000001.
        let mut rng = Rng(1);
        let out = rng.next_u64();
        assert_eq!(rng.0, 0x0200_0001);
        assert_eq!(out, 0x0200_0001u64.wrapping_mul(0x2545_F491_4F6C_DD1D));
    }

    #[test]
    fn rng_zero_state_is_substituted() {
        let mut a = Rng(0);
        let mut b = Rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..4 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn greedy_picks_lowest_tied_max_and_keeps_rng() {
        let mut rng = Rng(7);
        let logits = [1.0, f32::NAN, 3.0, 3.0, f32::NEG_INFINITY];
        assert_eq!(sample(&logits, &SamplerParams::GREEDY, &mut rng), 2);
        assert_eq!(rng, Rng(7));
    }

    /// The definition, one value at a time.
    fn argmax_by_value(logits: &[f32]) -> u32 {
        let (mut best, mut value) = (0u32, -1e30f32);
        for (id, &v) in (0u32..).zip(logits) {
            if v > value {
                (best, value) = (id, v);
            }
        }
        best
    }

    #[test]
    fn argmax_matches_the_definition_across_blocks() {
        let mut rng = Rng(11);
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            -1e30,
            -2e30,
        ];
        for n in [0, 1, 31, 32, 33, 100, 1000, 4099] {
            for trial in 0..40 {
                // Few distinct values (ties), some specials, sometimes all below -1e30.
                let logits: Vec<f32> = (0..n)
                    .map(|_| {
                        let r = rng.next_u64();
                        match (trial % 4, r % 13) {
                            (3, _) => -3e30,
                            (_, k) if k < specials.len() as u64 && trial % 2 == 1 => {
                                specials[k as usize]
                            }
                            _ => (r >> 32) as f32 % 7.0 - 3.0,
                        }
                    })
                    .collect();
                assert_eq!(
                    argmax(&logits),
                    argmax_by_value(&logits),
                    "{n} values, trial {trial}: {logits:?}"
                );
            }
        }
    }

    #[test]
    fn greedy_takes_positive_infinity_and_defaults_to_zero() {
        let mut rng = Rng(7);
        let g = SamplerParams::GREEDY;
        assert_eq!(sample(&[0.0, f32::INFINITY, 5.0], &g, &mut rng), 1);
        assert_eq!(
            sample(&[f32::NAN, -1e31, f32::NEG_INFINITY], &g, &mut rng),
            0
        );
        assert_eq!(sample(&[], &g, &mut rng), 0);
    }

    #[test]
    fn no_finite_logit_falls_back_to_argmax_without_drawing() {
        let logits = [f32::NAN, f32::NEG_INFINITY, f32::INFINITY];
        for p in [
            params(1.0, 0, 1.0, 0.0),
            params(1.0, 0, 0.5, 0.0),
            params(1.0, 5, 1.0, 0.0),
        ] {
            let mut rng = Rng(3);
            assert_eq!(sample(&logits, &p, &mut rng), 2);
            assert_eq!(rng, Rng(3));
            assert_eq!(sample(&[], &p, &mut rng), 0);
        }
    }

    #[test]
    fn non_finite_logits_are_never_sampled() {
        let logits = [f32::NAN, 0.0, f32::INFINITY, f32::NEG_INFINITY, 0.0];
        let mut s = Sampler::new(params(100.0, 0, 1.0, 0.0), 11);
        for _ in 0..200 {
            let id = s.sample(&logits);
            assert!(id == 1 || id == 4, "sampled {id}");
        }
    }

    #[test]
    fn one_draw_per_sampling_call() {
        let logits = [0.5, 1.0, 0.25];
        for p in [
            params(1.0, 0, 1.0, 0.0),
            params(1.0, 0, 0.5, 0.1),
            params(0.7, 1, 1.0, 0.0),
            params(0.7, 3000, 0.9, 0.0),
        ] {
            let mut rng = Rng(99);
            let mut expected = Rng(99);
            sample(&logits, &p, &mut rng);
            expected.next_u64();
            assert_eq!(rng, expected, "{p:?}");
        }
    }

    #[test]
    fn nan_temperature_returns_best_without_drawing() {
        let logits = [0.5, 2.0, 2.0, 1.0];
        for p in [
            params(f32::NAN, 0, 1.0, 0.0),
            params(f32::NAN, 0, 0.5, 0.0),
            params(f32::NAN, 2, 1.0, 0.0),
        ] {
            let mut rng = Rng(5);
            assert_eq!(sample(&logits, &p, &mut rng), 1);
            assert_eq!(rng, Rng(5));
        }
    }

    #[test]
    fn lazy_ranking_matches_a_full_stable_sort() {
        // Many ties and both zeros: the lazily extended prefix must equal a stable sort.
        let mut rng = Rng(1234);
        let logits: Vec<f32> = (0..5000u32)
            .map(|id| {
                let bucket = (rng.next_u64() % 50) as f32 - 25.0;
                if bucket == 0.0 && id % 2 == 0 {
                    -0.0
                } else {
                    bucket / 4.0
                }
            })
            .collect();
        let mut expected: Vec<u32> = (0..5000).collect();
        expected.sort_by(|&a, &b| {
            logits[b as usize]
                .partial_cmp(&logits[a as usize])
                .unwrap_or(Ordering::Equal)
        });
        let mut keys: Vec<u64> = (0u32..)
            .zip(&logits)
            .map(|(id, &v)| rank_key(v, id))
            .collect();
        let mut ranked = LazyRanking::new(&mut keys);
        for (i, &e) in expected.iter().enumerate() {
            assert_eq!(ranked.id(i), e, "rank {i}");
        }
    }

    #[test]
    fn rank_key_orders_by_logit_then_id() {
        let order = [
            (f32::MAX, 9),
            (1.5, 2),
            (1.5, 3),
            (0.0, 1),
            (-0.0, 4),
            (0.0, 5),
            (-1e-45, 0),
            (-2.0, 0),
            (f32::MIN, 0),
        ];
        for w in order.windows(2) {
            assert!(rank_key(w[0].0, w[0].1) < rank_key(w[1].0, w[1].1), "{w:?}");
        }
        assert_eq!(key_id(rank_key(-3.25, 77)), 77);
    }

    #[test]
    fn default_params_are_ds4_cli_defaults() {
        let d = SamplerParams::default();
        assert_eq!(
            (d.temperature, d.top_k, d.top_p, d.min_p),
            (1.0, 0, 1.0, 0.05)
        );
        assert!(Sampler::greedy().params.is_greedy());
        assert!(!d.is_greedy());
    }
}
