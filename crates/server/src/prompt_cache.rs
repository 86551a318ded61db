//! Prompt reuse keyed by text, on top of the session's token-level prefix reuse.
//!
//! Agents resend the whole conversation every turn. The chat template re-renders the
//! assistant's earlier answer as text, and tokenizing that text need not give the
//! token ids the model generated (BPE merges differ across the boundary, the model
//! may have chosen a non-canonical split). A token-level common prefix then stops at
//! the first such answer and everything after it is evaluated again.
//!
//! The cache remembers the text the session's tokens stand for, with *marks*: points
//! where a byte offset of that text and a token count correspond exactly (the start,
//! the end of each tokenized prompt, and after every generated token). A new prompt's
//! text is compared with the remembered text; at the last mark inside the common text
//! prefix the session's own tokens are kept and only the remaining text is tokenized.
//! When the new text diverges before any mark, the canonical tokenization is used, so
//! a fresh conversation is tokenized exactly as `ds4-server run` tokenizes it.

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

impl PromptCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds the tokens for prompt `text` given the session's tokens `held`.
    /// `canonical` is the text's full tokenization; `tokenize_rest` tokenizes a
    /// continuation (no BOS).
    pub fn align(
        &self,
        held: &[u32],
        text: &str,
        canonical: Vec<u32>,
        tokenize_rest: &dyn Fn(&str) -> Vec<u32>,
    ) -> AlignedPrompt {
        let lcp = common_prefix(text.as_bytes(), &self.bytes);
        let best = self
            .marks
            .iter()
            .rev()
            .find(|m| m.bytes <= lcp && m.tokens <= held.len() && text.is_char_boundary(m.bytes))
            .copied()
            .unwrap_or(ORIGIN);
        let canonical_reuse = common_prefix(&canonical, held);
        if best.tokens == 0 || canonical_reuse >= best.tokens {
            let marks = vec![
                ORIGIN,
                Mark {
                    bytes: text.len(),
                    tokens: canonical.len(),
                },
            ];
            return AlignedPrompt {
                tokens: canonical,
                spliced: 0,
                text: Some(text.as_bytes().to_vec()),
                marks,
            };
        }
        let mut tokens = held[..best.tokens].to_vec();
        tokens.extend(tokenize_rest(&text[best.bytes..]));
        let mut marks: Vec<Mark> = self
            .marks
            .iter()
            .copied()
            .filter(|m| m.tokens <= best.tokens && m.bytes <= best.bytes)
            .collect();
        if text.len() > best.bytes {
            marks.push(Mark {
                bytes: text.len(),
                tokens: tokens.len(),
            });
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy tokenizer: "ab" merges into one token (99), other bytes are tokens.
    fn tok(text: &str) -> Vec<u32> {
        let b = text.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i..].starts_with(b"ab") {
                out.push(99);
                i += 2;
            } else {
                out.push(b[i] as u32);
                i += 1;
            }
        }
        out
    }

    fn piece(id: u32) -> Vec<u8> {
        if id == 99 {
            b"ab".to_vec()
        } else {
            vec![id as u8]
        }
    }

    #[test]
    fn splices_generated_tokens_that_retokenize_differently() {
        let mut cache = PromptCache::new();
        let p1 = "U:hi\nA:";
        let aligned = cache.align(&[], p1, tok(p1), &tok);
        assert_eq!(aligned.spliced, 0);
        // The model generated "a", "b", "x" as separate tokens, then an end token (0).
        let generated = [b'a' as u32, b'b' as u32, b'x' as u32, 0];
        let mut held = aligned.tokens.clone();
        held.extend_from_slice(&generated[..3]);
        cache.commit(&aligned, &generated, &piece, &held);

        let p2 = "U:hi\nA:abx\nU:more\nA:";
        let canonical = tok(p2);
        // Token-level reuse would stop at "ab" (99 vs 'a').
        assert!(common_prefix(&canonical, &held) < held.len());
        let aligned2 = cache.align(&held, p2, canonical, &tok);
        assert_eq!(aligned2.spliced, held.len());
        assert_eq!(&aligned2.tokens[..held.len()], &held[..]);
        assert_eq!(&aligned2.tokens[held.len()..], &tok("\nU:more\nA:")[..]);
    }

    #[test]
    fn edited_answer_keeps_the_part_before_the_edit() {
        let mut cache = PromptCache::new();
        let p1 = "Q:";
        let a = cache.align(&[], p1, tok(p1), &tok);
        let generated: Vec<u32> = "xyz".bytes().map(u32::from).collect();
        let mut held = a.tokens.clone();
        held.extend_from_slice(&generated[..2]);
        cache.commit(&a, &generated, &piece, &held);
        // The client changed the answer's second character.
        let p2 = "Q:xq";
        let b = cache.align(&held, p2, tok(p2), &tok);
        assert_eq!(b.spliced, 0, "canonical reuse is as good here");
        assert_eq!(common_prefix(&b.tokens, &held), 3);
    }

    #[test]
    fn divergent_prompt_uses_canonical_tokens() {
        let mut cache = PromptCache::new();
        let a = cache.align(&[], "abc", tok("abc"), &tok);
        let held = a.tokens.clone();
        cache.commit(&a, &[], &piece, &held);
        let b = cache.align(&held, "abd", tok("abd"), &tok);
        assert_eq!(b.tokens, tok("abd"));
        assert_eq!(b.spliced, 0);
    }

    #[test]
    fn session_behind_the_record_drops_marks() {
        let mut cache = PromptCache::new();
        let a = cache.align(&[], "Q:", tok("Q:"), &tok);
        let generated: Vec<u32> = "xab".bytes().map(u32::from).collect();
        // The session lost everything (e.g. a failed prefill).
        cache.commit(&a, &generated, &piece, &[]);
        let b = cache.align(&[], "Q:xab!", tok("Q:xab!"), &tok);
        assert_eq!(b.spliced, 0);
        assert_eq!(b.tokens, tok("Q:xab!"));
    }
}
