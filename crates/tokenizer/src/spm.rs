//! SentencePiece-style tokenization of one text fragment (`tokenizer.ggml.model = llama`).
//!
//! Follows llama.cpp `src/llama-vocab.cpp` (`llm_tokenizer_spm_session`): the text (spaces
//! already escaped as U+2581 "▁") starts as one symbol per character; any adjacent pair whose
//! concatenation is a vocabulary entry is a candidate, the candidate with the highest token
//! score merges first (the leftmost among equal scores); a candidate whose combined length
//! no longer matches is skipped. Symbols that are not vocabulary entries at the end become
//! byte tokens `<0xXX>` (byte fallback).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

/// Appends the tokens of `text` (whitespace already escaped) to `out`.
pub(crate) fn encode(text: &str, vocab: &Vocab, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (start, c) in text.char_indices() {
        let i = symbols.len() as i32;
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: i - 1,
            next: i + 1,
        });
    }
    let Some(last) = symbols.last_mut() else {
        return;
    };
    last.next = -1;

    let mut queue = BinaryHeap::new();
    for i in 1..symbols.len() {
        push_pair(text, vocab, &symbols, i - 1, i, &mut queue);
    }
    while let Some(pair) = queue.pop() {
        let (l, r) = (pair.left, pair.right);
        if symbols[l].len == 0 || symbols[r].len == 0 || symbols[l].len + symbols[r].len != pair.len
        {
            continue;
        }
        symbols[l].len += symbols[r].len;
        symbols[r].len = 0;
        symbols[l].next = symbols[r].next;
        if symbols[r].next >= 0 {
            let next = symbols[r].next as usize;
            symbols[next].prev = l as i32;
        }
        if symbols[l].prev >= 0 {
            push_pair(
                text,
                vocab,
                &symbols,
                symbols[l].prev as usize,
                l,
                &mut queue,
            );
        }
        if symbols[l].next >= 0 {
            push_pair(
                text,
                vocab,
                &symbols,
                l,
                symbols[l].next as usize,
                &mut queue,
            );
        }
    }

    let mut i = 0i32;
    while i >= 0 {
        let sym = symbols[i as usize];
        let piece = &text[sym.start..sym.start + sym.len];
        match vocab.text_to_token(piece) {
            Some(id) => out.push(id),
            // Merged symbols are always entries, so this is one character not in the
            // vocabulary: its UTF-8 bytes as byte tokens.
            None => out.extend(piece.bytes().filter_map(|b| byte_token(vocab, b))),
        }
        i = sym.next;
    }
}

/// The token of byte `b`: `<0xXX>`, else the one-character entry, else the unknown token.
pub(crate) fn byte_token(vocab: &Vocab, b: u8) -> Option<u32> {
    vocab
        .text_to_token(&format!("<0x{b:02X}>"))
        .or_else(|| {
            std::str::from_utf8(&[b])
                .ok()
                .and_then(|s| vocab.text_to_token(s))
        })
        .or(vocab.special.unk)
}

fn push_pair(
    text: &str,
    vocab: &Vocab,
    symbols: &[Symbol],
    l: usize,
    r: usize,
    queue: &mut BinaryHeap<Pair>,
) {
    let start = symbols[l].start;
    let len = symbols[l].len + symbols[r].len;
    let Some(id) = vocab.text_to_token(&text[start..start + len]) else {
        return;
    };
    queue.push(Pair {
        score: vocab.scores[id as usize],
        left: l,
        right: r,
        len,
    });
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    /// Byte length; 0 once merged into its left neighbour.
    len: usize,
    prev: i32,
    next: i32,
}

/// A queued merge; the heap pops the highest score, then the leftmost.
#[derive(Debug)]
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Pair {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}
