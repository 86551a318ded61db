//! The order in which llama.cpp visits its token-text map.
//!
//! llama.cpp finds EOT and FIM tokens by text with loops over its
//! `std::unordered_map<std::string, llama_token> token_to_id`, and the first match wins.
//! When a vocabulary has several candidates (SmolLM2 and Qwen2.5 both have `<|im_end|>`
//! and `<|endoftext|>`), which one becomes the EOT token depends on the map's iteration
//! order: llama.cpp picks `<|endoftext|>` for SmolLM2 and `<|im_end|>` for Qwen2.5.
//!
//! This module reproduces that order for the GNU C++ library (the library of llama.cpp's
//! Linux builds): `std::hash<std::string>` (`_Hash_bytes`, a 64-bit MurmurHash2 variant
//! with seed 0xc70f6907), buckets at `hash % bucket_count`, insertion at the head of a
//! bucket (or of the whole node list when the bucket is empty), and the bucket counts
//! `_Prime_rehash_policy` chooses when a map grows one insertion at a time from empty
//! (max load factor 1). The map is filled in token-id order; a repeated text keeps its
//! node from the first insertion.

/// `(element count that triggers the growth, new bucket count)` for a map growing one
/// insertion at a time (libstdc++ `_Prime_rehash_policy`, max load factor 1.0).
const GROWTH: [(u64, u64); 29] = [
    (1, 13),
    (14, 29),
    (30, 59),
    (60, 127),
    (128, 257),
    (258, 541),
    (542, 1109),
    (1110, 2357),
    (2358, 5087),
    (5088, 10273),
    (10274, 20753),
    (20754, 42043),
    (42044, 85229),
    (85230, 172933),
    (172934, 351061),
    (351062, 712697),
    (712698, 1447153),
    (1447154, 2938679),
    (2938680, 5967347),
    (5967348, 12117689),
    (12117690, 24607243),
    (24607244, 49969847),
    (49969848, 101473717),
    (101473718, 206062531),
    (206062532, 418451333),
    (418451334, 849749479),
    (849749480, 1725587117),
    (1725587118, 3504151727),
    (3504151728, 8589934583),
];

/// libstdc++ `std::_Hash_bytes(data, len, 0xc70f6907)` on a 64-bit target.
pub(crate) fn libstdcxx_hash(data: &[u8]) -> u64 {
    const MUL: u64 = (0xc6a4_a793u64 << 32) + 0x5bd1_e995;
    const SEED: u64 = 0xc70f_6907;
    let shift_mix = |v: u64| v ^ (v >> 47);
    let mut hash = SEED ^ (data.len() as u64).wrapping_mul(MUL);
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let v = shift_mix(u64::from_le_bytes(word).wrapping_mul(MUL)).wrapping_mul(MUL);
        hash ^= v;
        hash = hash.wrapping_mul(MUL);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        let v = tail
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8).wrapping_add(u64::from(b)));
        hash ^= v;
        hash = hash.wrapping_mul(MUL);
    }
    hash = shift_mix(hash).wrapping_mul(MUL);
    shift_mix(hash)
}

const NIL: u32 = u32::MAX;
/// Stands for the list head (`_M_before_begin`) in a bucket slot.
const HEAD: u32 = u32::MAX - 1;

/// Token ids in the order llama.cpp's `token_to_id` loops visit them (one id per distinct
/// text: the last id with that text, as the map stores it). `has_duplicates` says whether
/// some text occurs under several ids.
pub(crate) fn llama_visit_order(texts: &[String], has_duplicates: bool) -> Vec<u32> {
    // Nodes are distinct texts, numbered in insertion order.
    let mut node_of: rustc_hash::FxHashMap<&str, u32> = rustc_hash::FxHashMap::default();
    if has_duplicates {
        node_of.reserve(texts.len());
    }
    let mut node_id: Vec<u32> = Vec::with_capacity(texts.len());
    let mut codes: Vec<u64> = Vec::with_capacity(texts.len());
    let mut next: Vec<u32> = Vec::with_capacity(texts.len());
    let mut head = NIL;
    let mut buckets: Vec<u32> = vec![NIL; 1];
    let mut growth = GROWTH.iter().peekable();

    for (id, text) in texts.iter().enumerate() {
        let node = node_id.len() as u32;
        if has_duplicates {
            if let Some(&first) = node_of.get(text.as_str()) {
                node_id[first as usize] = id as u32;
                continue;
            }
            node_of.insert(text, node);
        }
        node_id.push(id as u32);
        codes.push(libstdcxx_hash(text.as_bytes()));
        next.push(NIL);

        let count = u64::from(node) + 1;
        if let Some(&&(at, size)) = growth.peek()
            && count >= at
        {
            growth.next();
            head = rehash(head, &mut next, &codes, &mut buckets, size as usize);
        }
        let n_buckets = buckets.len() as u64;
        let b = (codes[node as usize] % n_buckets) as usize;
        match buckets[b] {
            NIL => {
                next[node as usize] = head;
                head = node;
                if next[node as usize] != NIL {
                    let old = next[node as usize] as usize;
                    buckets[(codes[old] % n_buckets) as usize] = node;
                }
                buckets[b] = HEAD;
            }
            before => {
                let after = if before == HEAD {
                    head
                } else {
                    next[before as usize]
                };
                next[node as usize] = after;
                if before == HEAD {
                    head = node;
                } else {
                    next[before as usize] = node;
                }
            }
        }
    }

    let mut order = Vec::with_capacity(node_id.len());
    let mut p = head;
    while p != NIL {
        order.push(node_id[p as usize]);
        p = next[p as usize];
    }
    order
}

/// `_M_rehash_aux` for unique keys: relinks every node into `size` new buckets; returns the
/// new list head.
fn rehash(head: u32, next: &mut [u32], codes: &[u64], buckets: &mut Vec<u32>, size: usize) -> u32 {
    let mut new_buckets = vec![NIL; size];
    let mut new_head = NIL;
    let mut first_bucket = 0usize;
    let mut p = head;
    while p != NIL {
        let following = next[p as usize];
        let b = (codes[p as usize] % size as u64) as usize;
        match new_buckets[b] {
            NIL => {
                next[p as usize] = new_head;
                new_head = p;
                new_buckets[b] = HEAD;
                if next[p as usize] != NIL {
                    new_buckets[first_bucket] = p;
                }
                first_bucket = b;
            }
            before => {
                let after = if before == HEAD {
                    new_head
                } else {
                    next[before as usize]
                };
                next[p as usize] = after;
                if before == HEAD {
                    new_head = p;
                } else {
                    next[before as usize] = p;
                }
            }
        }
        p = following;
    }
    *buckets = new_buckets;
    new_head
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_matches_libstdcxx() {
        // Values printed by `std::hash<std::string>` from GCC 12's libstdc++ (x86-64).
        assert_eq!(libstdcxx_hash(b""), 6142509188972423790);
        assert_eq!(libstdcxx_hash(b"a"), 4993892634952068459);
        assert_eq!(libstdcxx_hash(b"hello"), 2762169579135187400);
        assert_eq!(libstdcxx_hash(b"<|im_end|>"), 2038672007907099973);
        assert_eq!(libstdcxx_hash(b"<|endoftext|>"), 3113324847494305268);
        assert_eq!(libstdcxx_hash(b"0123456789abcdefXYZ"), 3947215215395305647);
    }
}
