//! Splitting text on special-token strings before tokenizing.
//!
//! Follows llama.cpp `src/llama-vocab.cpp` (`tokenizer_st_partition`): the special tokens
//! (control, user-defined and unknown tokens), longest text first, each split every
//! remaining text fragment at each of its occurrences. With `parse_special = false` control
//! and unknown tokens are skipped, but user-defined tokens still split the text (as Hugging
//! Face `tokenizers` does for added tokens). A token with the LSTRIP/RSTRIP attribute eats
//! the ASCII white space before/after it.

use crate::vocab::{Vocab, attr};

/// A piece of the input: text still to tokenize (a byte range), or a special token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text { start: usize, end: usize },
    Token(u32),
}

/// C `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Splits `text` into fragments on the vocabulary's special tokens.
pub(crate) fn partition(text: &str, vocab: &Vocab, parse_special: bool) -> Vec<Fragment> {
    let bytes = text.as_bytes();
    let mut fragments = Vec::new();
    if !text.is_empty() {
        fragments.push(Fragment::Text {
            start: 0,
            end: text.len(),
        });
    }
    for &id in &vocab.special_cache {
        let token_attr = vocab.attr(id);
        if !parse_special && token_attr & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let needle = vocab.texts[id as usize].as_str();
        if !fragments.iter().any(
            |f| matches!(*f, Fragment::Text { start, end } if text[start..end].contains(needle)),
        ) {
            continue;
        }
        let mut out = Vec::with_capacity(fragments.len() + 2);
        for fragment in fragments {
            let Fragment::Text { mut start, end } = fragment else {
                out.push(fragment);
                continue;
            };
            while let Some(found) = text[start..end].find(needle) {
                let at = start + found;
                let mut left_end = at;
                if token_attr & attr::LSTRIP != 0 {
                    while left_end > start && is_c_space(bytes[left_end - 1]) {
                        left_end -= 1;
                    }
                }
                if left_end > start {
                    out.push(Fragment::Text {
                        start,
                        end: left_end,
                    });
                }
                out.push(Fragment::Token(id));
                start = at + needle.len();
                if token_attr & attr::RSTRIP != 0 {
                    while start < end && is_c_space(bytes[start]) {
                        start += 1;
                    }
                }
            }
            if end > start {
                out.push(Fragment::Text { start, end });
            }
        }
        fragments = out;
    }
    fragments
}
