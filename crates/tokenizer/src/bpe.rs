//! Byte-level BPE: merging the characters of one pre-tokenized word by merge rank.
//!
//! Follows llama.cpp `src/llama-vocab.cpp` (`llm_tokenizer_bpe_session::tokenize`): the word
//! (already in GPT-2's byte alphabet) starts as one symbol per character; the adjacent pair
//! with the lowest rank in `tokenizer.ggml.merges` merges first, the leftmost pair among
//! equal ranks; a pair whose sides changed since it was queued is skipped. Symbols that are
//! not vocabulary entries at the end fall back to single-byte tokens where those exist.
//!
//! Merge strings are interned: every merge side and every merge result gets a small id,
//! so a merge step is one integer-pair lookup.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use crate::vocab::Vocab;

type PairMap<V> = FxHashMap<(u32, u32), V>;

/// The merge table of one vocabulary.
///
/// Strings are numbered as "pieces": a vocabulary entry is the piece of its token id, any
/// other merge side or merge result gets an id from `n_vocab` up.
#[derive(Debug)]
pub(crate) struct BpeMerges {
    /// Pieces that are not vocabulary entries.
    extra: FxHashMap<Box<str>, u32>,
    n_vocab: u32,
    /// `(left, right)` pieces to `(rank, merged piece)`; the first listing of a pair wins.
    ranks: PairMap<(u32, u32)>,
}

impl BpeMerges {
    /// Builds the table from `tokenizer.ggml.merges` entries (`"left right"`).
    pub fn new(merges: &[&str], vocab: &Vocab) -> BpeMerges {
        let n_vocab = vocab.n_tokens() as u32;
        let mut extra: FxHashMap<Box<str>, u32> = FxHashMap::default();
        let mut intern = |s: &str| -> u32 {
            if let Some(id) = vocab.text_to_token(s).or_else(|| extra.get(s).copied()) {
                return id;
            }
            let id = n_vocab + extra.len() as u32;
            extra.insert(s.into(), id);
            id
        };
        let mut joined = String::new();
        let mut ranks = PairMap::default();
        ranks.reserve(merges.len());
        for (rank, merge) in merges.iter().enumerate() {
            // The separator is the first space after the first byte (a side may start
            // with a space-like character but never be empty).
            let space = merge
                .as_bytes()
                .get(1..)
                .and_then(|b| b.iter().position(|&c| c == b' '));
            let (left, right) = match space {
                Some(p) => (&merge[..p + 1], &merge[p + 2..]),
                None => ("", ""),
            };
            let l = intern(left);
            let r = intern(right);
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            let joined_id = intern(&joined);
            ranks.entry((l, r)).or_insert((rank as u32, joined_id));
        }
        BpeMerges {
            extra,
            n_vocab,
            ranks,
        }
    }

    /// The piece id of `s`, if it is a token or a merge string.
    fn piece(&self, s: &str, vocab: &Vocab) -> Option<u32> {
        vocab
            .text_to_token(s)
            .or_else(|| self.extra.get(s).copied())
    }

    /// Appends the tokens of one byte-encoded word to `out`.
    pub fn encode_word(&self, word: &str, vocab: &Vocab, out: &mut Vec<u32>) {
        if vocab.ignore_merges
            && let Some(id) = vocab.text_to_token(word)
        {
            out.push(id);
            return;
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
        for (start, c) in word.char_indices() {
            let len = c.len_utf8();
            let i = symbols.len() as i32;
            symbols.push(Symbol {
                start,
                len,
                piece: self.piece(&word[start..start + len], vocab),
                prev: i - 1,
                next: i + 1,
            });
        }
        if let Some(last) = symbols.last_mut() {
            last.next = -1;
        }

        let mut queue = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.push_pair(&symbols, i - 1, i, &mut queue);
        }
        while let Some(pair) = queue.pop() {
            let (l, r) = (pair.left, pair.right);
            if symbols[l].len != pair.left_len || symbols[r].len != pair.right_len {
                continue; // one side has changed since this pair was queued
            }
            symbols[l].len += symbols[r].len;
            symbols[l].piece = Some(pair.merged);
            symbols[r].len = 0;
            symbols[l].next = symbols[r].next;
            if symbols[r].next >= 0 {
                let next = symbols[r].next as usize;
                symbols[next].prev = l as i32;
            }
            if symbols[l].prev >= 0 {
                self.push_pair(&symbols, symbols[l].prev as usize, l, &mut queue);
            }
            if symbols[l].next >= 0 {
                self.push_pair(&symbols, l, symbols[l].next as usize, &mut queue);
            }
        }

        for sym in symbols.iter().filter(|s| s.len > 0) {
            let text = &word[sym.start..sym.start + sym.len];
            let token = match sym.piece {
                Some(p) if p < self.n_vocab => Some(p),
                _ => vocab.text_to_token(text),
            };
            match token {
                Some(id) => out.push(id),
                None => {
                    // Byte fallback: single-byte entries, where the vocabulary has them.
                    for b in text.bytes() {
                        if let Some(id) = std::str::from_utf8(&[b])
                            .ok()
                            .and_then(|s| vocab.text_to_token(s))
                        {
                            out.push(id);
                        }
                    }
                }
            }
        }
    }

    fn push_pair(&self, symbols: &[Symbol], l: usize, r: usize, queue: &mut BinaryHeap<Pair>) {
        let (Some(lp), Some(rp)) = (symbols[l].piece, symbols[r].piece) else {
            return;
        };
        if let Some(&(rank, merged)) = self.ranks.get(&(lp, rp)) {
            queue.push(Pair {
                rank,
                left: l,
                right: r,
                left_len: symbols[l].len,
                right_len: symbols[r].len,
                merged,
            });
        }
    }
}

/// One symbol of a word being merged (a linked list over the word's characters).
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    /// Byte length; 0 once merged into its left neighbour.
    len: usize,
    /// The interned string of this symbol, if it is one (otherwise it never merges).
    piece: Option<u32>,
    prev: i32,
    next: i32,
}

/// A queued merge candidate; the heap pops the lowest rank, then the leftmost.
#[derive(Debug, PartialEq, Eq)]
struct Pair {
    rank: u32,
    left: usize,
    right: usize,
    left_len: usize,
    right_len: usize,
    merged: u32,
}

impl Ord for Pair {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.rank, other.left).cmp(&(self.rank, self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
