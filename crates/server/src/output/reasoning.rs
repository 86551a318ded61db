//! Splits reasoning (`<think>…</think>`) from the answer in streamed text. Reasoning
//! is recognised only at the very start of the output (after whitespace), or from the
//! start when the prompt already opened the block.

use crate::holdback::{Scan, scan};

/// A piece of split output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Answer(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace seen yet; the open tag may still come.
    Start,
    Inside,
    /// After the close tag: leading whitespace of the answer is dropped.
    AfterClose,
    Answer,
}

/// Splits a whole generated text: `(reasoning, answer)`, the reasoning `None` when the
/// text has no reasoning block (the streaming [`ReasoningSplitter`]'s rules, with the
/// `<think>`/`</think>` tags of the families served).
pub fn split(text: &str, inside: bool) -> (Option<String>, String) {
    let (open, close) = (super::THINK_OPEN, super::THINK_CLOSE);
    let mut s = ReasoningSplitter::new(open, close, inside);
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    let has_block = inside || text.trim_start().starts_with(open);
    let mut reasoning = has_block.then(String::new);
    let mut answer = String::new();
    for p in pieces {
        match p {
            Piece::Reasoning(r) => reasoning.get_or_insert_with(String::new).push_str(&r),
            Piece::Answer(a) => answer.push_str(&a),
        }
    }
    (reasoning, answer)
}

/// The splitter for one generation.
#[derive(Debug)]
pub struct ReasoningSplitter {
    open: &'static str,
    close: &'static str,
    state: State,
    buf: String,
    /// Leading whitespace of the reasoning is still to be dropped.
    strip: bool,
}

impl ReasoningSplitter {
    /// `inside`: the prompt ended with the open tag.
    pub fn new(open: &'static str, close: &'static str, inside: bool) -> Self {
        ReasoningSplitter {
            open,
            close,
            state: if inside { State::Inside } else { State::Start },
            buf: String::new(),
            strip: true,
        }
    }

    /// Feeds text; returns the pieces it completes.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if let Some(rest) = t.strip_prefix(self.open) {
                        self.buf = rest.to_string();
                        self.state = State::Inside;
                        continue;
                    }
                    if !self.open.starts_with(t) {
                        self.state = State::Answer;
                        continue;
                    }
                    break;
                }
                State::Inside => {
                    if self.strip {
                        let t = self.buf.trim_start();
                        if t.len() != self.buf.len() {
                            self.buf = t.to_string();
                        }
                        if self.buf.is_empty() {
                            break;
                        }
                        self.strip = false;
                    }
                    if self.buf.is_empty() {
                        break;
                    }
                    match scan(&self.buf, self.close) {
                        Scan::Found(pos) => {
                            if pos > 0 {
                                out.push(Piece::Reasoning(self.buf[..pos].to_string()));
                            }
                            self.buf.drain(..pos + self.close.len());
                            self.state = State::AfterClose;
                        }
                        Scan::Safe(n) => {
                            if n > 0 {
                                out.push(Piece::Reasoning(self.buf[..n].to_string()));
                                self.buf.drain(..n);
                            }
                            break;
                        }
                    }
                }
                State::AfterClose => {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        self.buf.clear();
                        break;
                    }
                    self.buf = t.to_string();
                    self.state = State::Answer;
                }
                State::Answer => {
                    if !self.buf.is_empty() {
                        out.push(Piece::Answer(std::mem::take(&mut self.buf)));
                    }
                    break;
                }
            }
        }
        out
    }

    /// Ends the stream, releasing held text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.buf);
        if rest.is_empty() {
            return Vec::new();
        }
        match self.state {
            State::Inside => vec![Piece::Reasoning(rest)],
            State::AfterClose => Vec::new(),
            State::Start | State::Answer => vec![Piece::Answer(rest)],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_text_split() {
        let w = |t: &str, inside| super::split(t, inside);
        assert_eq!(
            w("\n<think>\nplan\n</think>\n\nAnswer.", false),
            (Some("plan\n".into()), "Answer.".into())
        );
        assert_eq!(
            w("No tags <think>x</think>", false),
            (None, "No tags <think>x</think>".into())
        );
        assert_eq!(
            w("still thinking", true),
            (Some("still thinking".into()), String::new())
        );
        assert_eq!(
            w("<think></think>Hi", false),
            (Some(String::new()), "Hi".into())
        );
    }

    fn split(inside: bool, pieces: &[&str]) -> (String, String) {
        let mut s = ReasoningSplitter::new("<think>", "</think>", inside);
        let (mut r, mut a) = (String::new(), String::new());
        let mut all: Vec<Piece> = pieces.iter().flat_map(|p| s.push(p)).collect();
        all.extend(s.finish());
        for p in all {
            match p {
                Piece::Reasoning(t) => r.push_str(&t),
                Piece::Answer(t) => a.push_str(&t),
            }
        }
        (r, a)
    }

    #[test]
    fn splits_a_leading_block() {
        assert_eq!(
            split(false, &["\n<thi", "nk>\nhmm</th", "ink>\n\nHello"]),
            ("hmm".into(), "Hello".into())
        );
    }

    #[test]
    fn prompt_opened_block() {
        assert_eq!(split(true, &["hmm</think>Hi"]), ("hmm".into(), "Hi".into()));
        assert_eq!(
            split(true, &["still thinking"]),
            ("still thinking".into(), "".into())
        );
    }

    #[test]
    fn tags_later_in_the_answer_are_text() {
        assert_eq!(
            split(false, &["Hi <think>x</think>"]),
            ("".into(), "Hi <think>x</think>".into())
        );
        assert_eq!(split(false, &["<"]), ("".into(), "<".into()));
        assert_eq!(split(false, &["  "]), ("".into(), "  ".into()));
    }
}
