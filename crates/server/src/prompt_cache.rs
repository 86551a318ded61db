//! Prompt reuse keyed by text, on top of the session's token-level prefix reuse.
//!
//! Agents resend the whole conversation every turn. The chat template re-renders the
//! assistant's earlier answer as text, and tokenizing that text need not give the
//! token ids the model generated (BPE merges differ across the boundary, the model
//! may have chosen a non-canonical split). A token-level common prefix then stops at
//! the first such answer and everything after it is evaluated again.
//!
//! The cache remembers the text a session's tokens stand for, with *marks*: points
//! where a byte offset of that text and a token count correspond exactly (the start,
//! every token boundary of a prompt, and after every generated token). A new prompt's
//! text is compared with the remembered text; at the last mark inside the common text
//! prefix the session's own tokens are kept and the rest of the prompt is the
//! canonical tokenization's tail from there. A mark is usable only where the
//! canonical tokenization of the new prompt has a token boundary at the same byte:
//! otherwise the tail would be tokenized differently from the canonical prompt (for
//! example a special token such as `<|im_end|>` cut in two and read as plain text).
//! When no mark is usable, the canonical tokenization is used, so a fresh conversation
//! is tokenized exactly as `ds4-server run` tokenizes it.

/// A point where `bytes` of text correspond to `tokens` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub bytes: usize,
    pub tokens: usize,
}

const ORIGIN: Mark = Mark {
    bytes: 0,
    tokens: 0,
};

/// A prompt ready for the session, with the text alignment to remember after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlignedPrompt {
    pub tokens: Vec<u32>,
    /// Leading tokens taken from the session by text alignment (0 when the canonical
    /// tokenization was used).
    pub spliced: usize,
    text: Option<Vec<u8>>,
    marks: Vec<Mark>,
}

impl AlignedPrompt {
    /// A prompt given as token ids (no text to align).
    pub fn from_tokens(tokens: Vec<u32>) -> Self {
        AlignedPrompt {
            tokens,
            spliced: 0,
            text: None,
            marks: vec![ORIGIN],
        }
    }
}

/// The text alignment of the live session.
#[derive(Debug, Clone)]
pub struct PromptCache {
    bytes: Vec<u8>,
    marks: Vec<Mark>,
}

impl Default for PromptCache {
    fn default() -> Self {
        PromptCache {
            bytes: Vec::new(),
            marks: vec![ORIGIN],
        }
    }
}

fn common_prefix<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Byte offsets of a prompt's canonical tokens: `offsets[k]` is where token `k` starts
/// and `offsets[len]` is the text's length. `None` when the tokens' pieces do not
/// spell the text (then no splicing is safe). A first token whose piece is not in the
/// text (a BOS the tokenizer added) has zero width.
pub fn token_offsets(
    text: &[u8],
    tokens: &[u32],
    piece: &dyn Fn(u32) -> Vec<u8>,
) -> Option<Vec<usize>> {
    let mut offsets = Vec::with_capacity(tokens.len() + 1);
    let mut pos = 0;
    for (i, &t) in tokens.iter().enumerate() {
        offsets.push(pos);
        let p = piece(t);
        if text[pos..].starts_with(&p) {
            pos += p.len();
        } else if i > 0 {
            return None;
        }
    }
    offsets.push(pos);
    (pos == text.len()).then_some(offsets)
}

impl PromptCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The prompt for `text` on a session holding `held`: `canonical` is the text's
    /// full tokenization and `offsets` its [`token_offsets`].
    pub fn align(
        &self,
        held: &[u32],
        text: &str,
        canonical: &[u32],
        offsets: Option<&[usize]>,
    ) -> AlignedPrompt {
        let canonical_marks = |from: usize, base: Mark| -> Vec<Mark> {
            match offsets {
                Some(off) => off[from + 1..]
                    .iter()
                    .enumerate()
                    .map(|(i, &b)| Mark {
                        bytes: b,
                        tokens: base.tokens + i + 1,
                    })
                    .collect(),
                None => vec![Mark {
                    bytes: text.len(),
                    tokens: base.tokens + canonical.len() - from,
                }],
            }
        };
        // The canonical token index where a mark's byte offset is a token boundary.
        let boundary = |m: &Mark| -> Option<usize> {
            if m.tokens == 0 {
                return Some(0);
            }
            let off = offsets?;
            let k = off.partition_point(|&b| b <= m.bytes);
            (k > 0 && off[k - 1] == m.bytes).then(|| k - 1)
        };
        let lcp = common_prefix(text.as_bytes(), &self.bytes);
        let best = self.marks.iter().rev().find_map(|m| {
            if m.bytes > lcp || m.tokens > held.len() || !text.is_char_boundary(m.bytes) {
                return None;
            }
            boundary(m).map(|k| (*m, k))
        });
        let canonical_reuse = common_prefix(canonical, held);
        let Some((best, k)) = best.filter(|(m, _)| m.tokens > 0 && canonical_reuse < m.tokens)
        else {
            let mut marks = vec![ORIGIN];
            marks.extend(canonical_marks(0, ORIGIN));
            return AlignedPrompt {
                tokens: canonical.to_vec(),
                spliced: 0,
                text: Some(text.as_bytes().to_vec()),
                marks,
            };
        };
        let mut tokens = held[..best.tokens].to_vec();
        tokens.extend_from_slice(&canonical[k..]);
        let mut marks: Vec<Mark> = self
            .marks
            .iter()
            .copied()
            .filter(|m| m.tokens <= best.tokens && m.bytes <= best.bytes)
            .collect();
        if text.len() > best.bytes {
            marks.extend(canonical_marks(k, best));
        }
        AlignedPrompt {
            tokens,
            spliced: best.tokens,
            text: Some(text.as_bytes().to_vec()),
            marks,
        }
    }

    /// Remembers what the session holds after a request: the prompt, then the
    /// generated tokens whose text (`piece`, special tokens rendered) the template will
    /// write back. `held` is the session's actual frontier; marks past the point where
    /// it departs from `prompt + generated` are dropped.
    pub fn commit(
        &mut self,
        prompt: &AlignedPrompt,
        generated: &[u32],
        piece: &dyn Fn(u32) -> Vec<u8>,
        held: &[u32],
    ) {
        let n = prompt.tokens.len();
        let mut agree = common_prefix(&prompt.tokens, held);
        if agree == n {
            agree += common_prefix(generated, &held[n..]);
        }
        let Some(text) = &prompt.text else {
            *self = PromptCache::new();
            return;
        };
        let mut bytes = text.clone();
        let mut marks = prompt.marks.clone();
        if agree > n {
            for (i, &id) in generated[..agree - n].iter().enumerate() {
                bytes.extend_from_slice(&piece(id));
                marks.push(Mark {
                    bytes: bytes.len(),
                    tokens: n + i + 1,
                });
            }
        }
        marks.retain(|m| m.tokens <= agree);
        let end = marks.last().map_or(0, |m| m.bytes);
        bytes.truncate(end);
        self.bytes = bytes;
        self.marks = marks;
    }

    /// The remembered text and marks, for saving (see [`PromptCache::from_parts`]).
    pub fn parts(&self) -> (&[u8], &[Mark]) {
        (&self.bytes, &self.marks)
    }

    /// A cache from saved parts; `None` when they are inconsistent (marks out of order
    /// or past the text, or not starting at the origin).
    pub fn from_parts(bytes: Vec<u8>, marks: Vec<Mark>) -> Option<Self> {
        let ordered = marks
            .windows(2)
            .all(|w| w[0].bytes <= w[1].bytes && w[0].tokens < w[1].tokens);
        let ok = marks.first() == Some(&ORIGIN)
            && ordered
            && marks.last().is_some_and(|m| m.bytes <= bytes.len());
        ok.then_some(PromptCache { bytes, marks })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy tokenizer: "<e>" is one special token (300), "ab" merges into one token
    /// (301), other bytes are tokens.
    fn tok(text: &str) -> Vec<u32> {
        let b = text.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i..].starts_with(b"<e>") {
                out.push(300);
                i += 3;
            } else if b[i..].starts_with(b"ab") {
                out.push(301);
                i += 2;
            } else {
                out.push(b[i] as u32);
                i += 1;
            }
        }
        out
    }

    fn piece(id: u32) -> Vec<u8> {
        match id {
            300 => b"<e>".to_vec(),
            301 => b"ab".to_vec(),
            _ => vec![id as u8],
        }
    }

    fn align(cache: &PromptCache, held: &[u32], text: &str) -> AlignedPrompt {
        let canonical = tok(text);
        let offsets = token_offsets(text.as_bytes(), &canonical, &piece);
        cache.align(held, text, &canonical, offsets.as_deref())
    }

    #[test]
    fn splices_generated_tokens_that_retokenize_differently() {
        let mut cache = PromptCache::new();
        let p1 = "U:hi\nA:";
        let aligned = align(&cache, &[], p1);
        assert_eq!(aligned.spliced, 0);
        // The model generated "a", "b", "x" as separate tokens, then an end token (0).
        let generated = [b'a' as u32, b'b' as u32, b'x' as u32, 0];
        let mut held = aligned.tokens.clone();
        held.extend_from_slice(&generated[..3]);
        cache.commit(&aligned, &generated, &piece, &held);

        let p2 = "U:hi\nA:abx\nU:more\nA:";
        // Token-level reuse would stop at "ab" (301 vs 'a').
        assert!(common_prefix(&tok(p2), &held) < held.len());
        let aligned2 = align(&cache, &held, p2);
        assert_eq!(aligned2.spliced, held.len());
        assert_eq!(&aligned2.tokens[..held.len()], &held[..]);
        assert_eq!(&aligned2.tokens[held.len()..], &tok("\nU:more\nA:")[..]);
    }

    #[test]
    fn a_mark_inside_a_special_token_is_not_used() {
        let mut cache = PromptCache::new();
        let p1 = "U:hi\nA:";
        let a = align(&cache, &[], p1);
        // The model answered "<b" as plain tokens '<' and 'b'.
        let generated = [b'<' as u32, b'b' as u32];
        let mut held = a.tokens.clone();
        held.extend_from_slice(&generated);
        cache.commit(&a, &generated, &piece, &held);
        // The client resent the answer as empty text: "<e>" follows "A:". A mark sits
        // after '<', inside the special token: splicing there would read "e>" as text.
        let p2 = "U:hi\nA:<e>\nU:x";
        let b = align(&cache, &held, p2);
        assert_eq!(b.tokens, tok(p2), "the canonical tokens");
        assert!(b.tokens.contains(&300));
    }

    #[test]
    fn edited_answer_keeps_the_part_before_the_edit() {
        let mut cache = PromptCache::new();
        let p1 = "Q:";
        let a = align(&cache, &[], p1);
        let generated: Vec<u32> = "xyz".bytes().map(u32::from).collect();
        let mut held = a.tokens.clone();
        held.extend_from_slice(&generated[..2]);
        cache.commit(&a, &generated, &piece, &held);
        // The client changed the answer's second character.
        let p2 = "Q:xq";
        let b = align(&cache, &held, p2);
        assert_eq!(b.spliced, 0, "canonical reuse is as good here");
        assert_eq!(common_prefix(&b.tokens, &held), 3);
    }

    #[test]
    fn divergent_prompt_uses_canonical_tokens() {
        let mut cache = PromptCache::new();
        let a = align(&cache, &[], "abc");
        let held = a.tokens.clone();
        cache.commit(&a, &[], &piece, &held);
        let b = align(&cache, &held, "abd");
        assert_eq!(b.tokens, tok("abd"));
        assert_eq!(b.spliced, 0);
    }

    #[test]
    fn session_behind_the_record_drops_marks() {
        let mut cache = PromptCache::new();
        let a = align(&cache, &[], "Q:");
        let generated: Vec<u32> = "xab".bytes().map(u32::from).collect();
        // The session lost everything (e.g. a failed prefill).
        cache.commit(&a, &generated, &piece, &[]);
        let b = align(&cache, &[], "Q:xab!");
        assert_eq!(b.spliced, 0);
        assert_eq!(b.tokens, tok("Q:xab!"));
    }

    #[test]
    fn offsets_follow_pieces_and_refuse_other_text() {
        assert_eq!(
            token_offsets(b"ab<e>c", &tok("ab<e>c"), &piece),
            Some(vec![0, 2, 5, 6])
        );
        // A BOS (id 1, piece "<s>") the text does not hold has zero width.
        let with_bos = |id: u32| if id == 1 { b"<s>".to_vec() } else { piece(id) };
        assert_eq!(
            token_offsets(b"ab", &[1, 301], &with_bos),
            Some(vec![0, 0, 2])
        );
        assert_eq!(token_offsets(b"abc", &[301], &piece), None);
        let (bytes, marks) = (
            b"ab".to_vec(),
            vec![
                ORIGIN,
                Mark {
                    bytes: 2,
                    tokens: 1,
                },
            ],
        );
        assert!(PromptCache::from_parts(bytes.clone(), marks).is_some());
        assert!(
            PromptCache::from_parts(
                bytes,
                vec![Mark {
                    bytes: 3,
                    tokens: 1
                }]
            )
            .is_none()
        );
    }
}
