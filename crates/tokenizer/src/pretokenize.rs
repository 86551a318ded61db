//! Pre-tokenization: splitting text into the words that BPE merges within.
//!
//! Follows llama.cpp `src/unicode.cpp` (`unicode_regex_split`). A pre-tokenizer is a list
//! of regexes applied in order; each one splits every piece the previous ones produced into
//! its matches and the text between them (nothing is dropped). Four patterns that most
//! models use (GPT-2, Llama 3, Qwen2, Qwen3.5) have hand-written splitters in llama.cpp,
//! and the same hand-written logic is used here (it differs from a regex engine in corner
//! cases, and llama.cpp's output is the reference). Any other pattern runs on a regex
//! engine the way llama.cpp runs it on `std::regex`:
//!
//! - a pattern with `\p{..}` classes runs on a *collapsed* copy of the text, in which every
//!   non-ASCII code point is replaced by one stand-in character for its class (letter,
//!   number, punctuation, mark, symbol, other) and non-ASCII white space by `\x0B`; each
//!   `\p{X}` becomes "the stand-in of X, or the ASCII characters of X";
//! - a pattern without classes runs on the text itself, with non-ASCII white space replaced
//!   by `\x0B` (`std::wregex` only knows ASCII white space);
//! - `\s` is ASCII white space (`[\t\n\v\f\r ]`) in both cases.
//!
//! Positions are counted in code points; the result is a list of sub-slices of the input.

use crate::pre_table::{GPT2, LLAMA3, QWEN2, QWEN35};
use crate::unicode::{Class, Flags, class_of, is_whitespace};

/// Stand-ins for non-ASCII code points in the collapsed text (private-use characters, so
/// that no pattern character can match them by accident).
const REP_OTHER: char = '\u{F8D0}';
const REP_NUMBER: char = '\u{F8D1}';
const REP_LETTER: char = '\u{F8D2}';
const REP_PUNCT: char = '\u{F8D3}';
const REP_MARK: char = '\u{F8D4}';
const REP_SYMBOL: char = '\u{F8D5}';

/// ASCII white space as `std::regex`'s `\s` sees it, for use inside a bracket.
const ASCII_SPACE: &str = r"\t\n\x0B\x0C\r\x20";

/// One splitting step.
#[derive(Debug)]
enum Step {
    /// llama.cpp's hand-written GPT-2 splitter.
    Gpt2,
    /// llama.cpp's hand-written Llama 3 / Qwen2 / Qwen3.5 splitters.
    Modern(Modern),
    /// A pattern on the regex engine; `collapsed` says which copy of the text it runs on.
    Regex {
        regex: Box<fancy_regex::Regex>,
        collapsed: bool,
    },
}

/// The variants of the Llama 3 style splitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Modern {
    /// Digits in runs of up to three.
    Llama3,
    /// Single digits.
    Qwen2,
    /// Single digits; combining marks join letter runs.
    Qwen35,
}

/// A compiled pre-tokenizer.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
}

impl PreTokenizer {
    /// Compiles the regex list (llama.cpp syntax). Errors name the pattern that failed.
    pub fn new(regexes: &[&str]) -> Result<Self, String> {
        let steps = regexes
            .iter()
            .map(|&pattern| compile(pattern))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PreTokenizer { steps })
    }

    /// Splits `text` into words, in order; the words concatenate to `text`.
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let cps: Vec<char> = text.chars().collect();
        let mut lens = vec![cps.len()];
        let mut collapsed = None;
        let mut plain = None;
        for step in &self.steps {
            let mut out = Vec::with_capacity(lens.len() * 2);
            let mut start = 0;
            for &len in &lens {
                let (ini, end) = (start, start + len);
                start = end;
                match step {
                    Step::Gpt2 => split_gpt2(&cps, ini, end, &mut out),
                    Step::Modern(kind) => split_modern(*kind, &cps, ini, end, &mut out),
                    Step::Regex {
                        regex,
                        collapsed: c,
                    } => {
                        let view = if *c {
                            collapsed.get_or_insert_with(|| View::collapsed(&cps))
                        } else {
                            plain.get_or_insert_with(|| View::plain(&cps))
                        };
                        view.split(regex, ini, end, &mut out);
                    }
                }
            }
            lens = out;
        }
        let mut words = Vec::with_capacity(lens.len());
        let mut rest = text;
        for len in lens {
            let bytes: usize = rest.chars().take(len).map(char::len_utf8).sum();
            let (word, tail) = rest.split_at(bytes);
            words.push(word);
            rest = tail;
        }
        words
    }
}

fn compile(pattern: &str) -> Result<Step, String> {
    if pattern == GPT2 {
        return Ok(Step::Gpt2);
    }
    if pattern == LLAMA3 {
        return Ok(Step::Modern(Modern::Llama3));
    }
    if pattern == QWEN2 {
        return Ok(Step::Modern(Modern::Qwen2));
    }
    if pattern == QWEN35 {
        return Ok(Step::Modern(Modern::Qwen35));
    }
    let (translated, collapsed) = translate(pattern)?;
    let regex = fancy_regex::Regex::new(&translated)
        .map_err(|e| format!("pre-tokenizer regex {pattern:?}: {e}"))?;
    Ok(Step::Regex {
        regex: Box::new(regex),
        collapsed,
    })
}

/// The class names llama.cpp collapses, with the stand-in and ASCII members of each.
fn class_set(name: &str) -> Option<(char, &'static str)> {
    Some(match name {
        "N" => (REP_NUMBER, "0-9"),
        "L" | "Lu" | "Ll" | "Lt" | "Lm" | "Lo" => (REP_LETTER, "A-Za-z"),
        "P" => (
            REP_PUNCT,
            r"\x{21}-\x{23}\x{25}-\x{2A}\x{2C}-\x{2F}\x{3A}-\x{3B}\x{3F}-\x{40}\x{5B}-\x{5D}\x{5F}\x{7B}\x{7D}",
        ),
        "M" => (REP_MARK, ""),
        "S" => (
            REP_SYMBOL,
            r"\x{24}\x{2B}\x{3C}-\x{3E}\x{5E}\x{60}\x{7C}\x{7E}",
        ),
        _ => return None,
    })
}

/// Translates a llama.cpp pattern into the regex engine's syntax over the collapsed or the
/// plain text; returns the pattern and whether it is for the collapsed text.
fn translate(pattern: &str) -> Result<(String, bool), String> {
    let collapsed = ["N", "L", "P", "M", "S", "Lu", "Ll", "Lt", "Lm", "Lo"]
        .iter()
        .any(|name| pattern.contains(&format!("\\p{{{name}}}")));
    if collapsed && !pattern.is_ascii() {
        return Err(format!(
            "pre-tokenizer regex {pattern:?} mixes unicode classes and non-ASCII characters"
        ));
    }
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\\' && i + 1 < chars.len() {
            let d = chars[i + 1];
            match d {
                'p' if collapsed && chars.get(i + 2) == Some(&'{') => {
                    let close = chars[i + 3..]
                        .iter()
                        .position(|&ch| ch == '}')
                        .map(|p| p + i + 3)
                        .ok_or_else(|| format!("pre-tokenizer regex {pattern:?}: open \\p{{"))?;
                    let name: String = chars[i + 3..close].iter().collect();
                    let (rep, ascii) = class_set(&name).ok_or_else(|| {
                        format!("pre-tokenizer regex {pattern:?}: unsupported class \\p{{{name}}}")
                    })?;
                    if !inside {
                        out.push('[');
                    }
                    out.push(rep);
                    out.push_str(ascii);
                    if !inside {
                        out.push(']');
                    }
                    i = close + 1;
                    continue;
                }
                's' => {
                    if inside {
                        out.push_str(ASCII_SPACE);
                    } else {
                        out.push('[');
                        out.push_str(ASCII_SPACE);
                        out.push(']');
                    }
                }
                'S' if !inside => {
                    out.push_str("[^");
                    out.push_str(ASCII_SPACE);
                    out.push(']');
                }
                'd' => out.push_str(if inside { "0-9" } else { "[0-9]" }),
                'D' if !inside => out.push_str("[^0-9]"),
                'p' | 'P' | 'S' | 'D' | 'w' | 'W' | 'b' | 'B' => {
                    return Err(format!(
                        "pre-tokenizer regex {pattern:?}: unsupported escape \\{d}"
                    ));
                }
                _ => {
                    out.push(c);
                    out.push(d);
                }
            }
            i += 2;
            continue;
        }
        if c == '[' && !inside {
            inside = true;
        } else if c == ']' && inside {
            inside = false;
        }
        out.push(c);
        i += 1;
    }
    Ok((out, collapsed))
}

/// A copy of the text for the regex engine, with the byte offset of every code point.
struct View {
    text: String,
    /// `offsets[i]` is the byte offset of code point `i`; one extra entry for the end.
    offsets: Vec<usize>,
}

impl View {
    fn build(cps: &[char], map: impl Fn(char) -> char) -> View {
        let mut text = String::with_capacity(cps.len());
        let mut offsets = Vec::with_capacity(cps.len() + 1);
        for &c in cps {
            offsets.push(text.len());
            text.push(map(c));
        }
        offsets.push(text.len());
        View { text, offsets }
    }

    fn collapsed(cps: &[char]) -> View {
        View::build(cps, |c| {
            if c.is_ascii() {
                c
            } else if is_whitespace(c) {
                '\x0B'
            } else {
                match class_of(c) {
                    Class::Number => REP_NUMBER,
                    Class::Letter => REP_LETTER,
                    Class::Punctuation => REP_PUNCT,
                    Class::Mark => REP_MARK,
                    Class::Symbol => REP_SYMBOL,
                    _ => REP_OTHER,
                }
            }
        })
    }

    fn plain(cps: &[char]) -> View {
        View::build(cps, |c| {
            if !c.is_ascii() && is_whitespace(c) {
                '\x0B'
            } else {
                c
            }
        })
    }

    /// Splits code points `ini..end` into matches and the gaps between them.
    fn split(&self, regex: &fancy_regex::Regex, ini: usize, end: usize, out: &mut Vec<usize>) {
        let base = self.offsets[ini];
        let hay = &self.text[base..self.offsets[end]];
        let to_cp = |byte: usize| self.offsets.partition_point(|&o| o < base + byte);
        let mut done = ini;
        for found in regex.find_iter(hay) {
            // A backtracking limit hit leaves the rest of the piece unsplit.
            let Ok(m) = found else { break };
            let (s, e) = (to_cp(m.start()), to_cp(m.end()));
            if s > done {
                out.push(s - done);
            }
            if e > s {
                out.push(e - s);
            }
            done = e.max(done);
        }
        if end > done {
            out.push(end - done);
        }
    }
}

/// Code points of one piece, with "outside the piece" as `None`.
struct Piece<'a> {
    cps: &'a [char],
    end: usize,
}

impl Piece<'_> {
    fn cp(&self, pos: usize) -> Option<char> {
        (pos < self.end).then(|| self.cps[pos])
    }
    fn flags(&self, pos: usize) -> Option<Flags> {
        self.cp(pos).map(Flags::of)
    }
    fn is(&self, pos: usize, test: impl Fn(Flags) -> bool) -> bool {
        self.flags(pos).is_some_and(test)
    }
    fn is_space(&self, pos: usize) -> bool {
        self.is(pos, |f| f.whitespace)
    }
    /// `'s|'t|'re|'ve|'m|'ll|'d` at `pos` (case-insensitive if `fold`): its length.
    fn contraction(&self, pos: usize, fold: bool) -> Option<usize> {
        if self.cp(pos) != Some('\'') || pos + 1 >= self.end {
            return None;
        }
        let lower = |c: char| if fold { c.to_ascii_lowercase() } else { c };
        let next = lower(self.cps[pos + 1]);
        if matches!(next, 's' | 't' | 'm' | 'd') {
            return Some(2);
        }
        if pos + 2 < self.end {
            let next2 = lower(self.cps[pos + 2]);
            if matches!((next, next2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                return Some(3);
            }
        }
        None
    }
    /// The length of the white-space run at `pos`, and the end of its last `\r`/`\n`.
    fn space_run(&self, pos: usize) -> (usize, Option<usize>) {
        let mut n = 0;
        let mut last_newline_end = None;
        while self.is_space(pos + n) {
            if matches!(self.cps[pos + n], '\r' | '\n') {
                last_newline_end = Some(pos + n + 1);
            }
            n += 1;
        }
        (n, last_newline_end)
    }
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn split_gpt2(cps: &[char], ini: usize, end: usize, out: &mut Vec<usize>) {
    let p = Piece { cps, end };
    let other = |f: Flags| !(f.whitespace || f.is_letter() || f.is_number());
    let mut pos = ini;
    while pos < end {
        let start = pos;
        let c = cps[pos];
        if let Some(n) = p.contraction(pos, false) {
            pos += n;
        } else {
            // An optional leading space, then a run of one kind.
            let lead = usize::from(c == ' ');
            let kind = p.flags(pos + lead);
            if kind.is_some_and(Flags::is_letter) {
                pos += lead;
                while p.is(pos, Flags::is_letter) {
                    pos += 1;
                }
            } else if kind.is_some_and(Flags::is_number) {
                pos += lead;
                while p.is(pos, Flags::is_number) {
                    pos += 1;
                }
            } else if kind.is_some_and(other) {
                pos += lead;
                while p.is(pos, other) {
                    pos += 1;
                }
            } else {
                let (n, _) = p.space_run(pos);
                if n > 1 && pos + n < end {
                    // `\s+(?!\S)`: leave the last space to the word that follows.
                    pos += n - 1;
                } else if n > 0 {
                    pos += n;
                } else {
                    pos += 1;
                }
            }
        }
        out.push(pos - start);
    }
}

/// Llama 3 / Qwen2 / Qwen3.5:
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
/// (Qwen: `\p{N}`; Qwen3.5: `[\p{L}\p{M}]` for `\p{L}`).
fn split_modern(kind: Modern, cps: &[char], ini: usize, end: usize, out: &mut Vec<usize>) {
    let p = Piece { cps, end };
    let marks = kind == Modern::Qwen35;
    let wordy = |f: Flags| f.is_letter() || (marks && f.is_mark());
    let other = |f: Flags| !(f.whitespace || wordy(f) || f.is_number());
    let mut pos = ini;
    let emit = |from: usize, to: usize, out: &mut Vec<usize>| {
        if to > from {
            out.push(to - from);
        }
    };
    while pos < end {
        let start = pos;
        let c = cps[pos];
        let flags = Flags::of(c);
        if let Some(n) = p.contraction(pos, true) {
            pos += n;
            emit(start, pos, out);
            continue;
        }
        // `[^\r\n\p{L}\p{N}]?\p{L}+`
        if !(c == '\r' || c == '\n' || flags.is_number()) && (wordy(flags) || p.is(pos + 1, wordy))
        {
            pos += 1;
            while p.is(pos, wordy) {
                pos += 1;
            }
            emit(start, pos, out);
            continue;
        }
        if flags.is_number() {
            if kind == Modern::Llama3 {
                // `\p{N}{1,3}`: a run of digits cut into threes.
                let mut group = pos;
                while p.is(pos, Flags::is_number) {
                    pos += 1;
                    if pos - group >= 3 {
                        emit(group, pos, out);
                        group = pos;
                    }
                }
                emit(group, pos, out);
            } else {
                pos += 1;
                emit(start, pos, out);
            }
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let kind2 = if c == ' ' {
            p.flags(pos + 1)
        } else {
            Some(flags)
        };
        if kind2.is_none_or(other) {
            pos += usize::from(c == ' ');
            while p.is(pos, other) {
                pos += 1;
            }
            while matches!(p.cp(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            emit(start, pos, out);
            continue;
        }
        let (n, last_newline_end) = p.space_run(pos);
        if let Some(e) = last_newline_end {
            // `\s*[\r\n]+`
            pos = e;
        } else if n > 1 && pos + n < end {
            // `\s+(?!\S)`
            pos += n - 1;
        } else if n > 0 {
            pos += n;
        } else {
            pos += 1;
        }
        emit(start, pos, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(regexes: &[&str], text: &str) -> Vec<String> {
        PreTokenizer::new(regexes)
            .unwrap()
            .split(text)
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(
            split(&[GPT2], "Hello world's  end!!\n\n 123"),
            ["Hello", " world", "'s", " ", " end", "!!", "\n\n", " 123"]
        );
    }

    #[test]
    fn llama3_digits_and_newlines() {
        assert_eq!(
            split(&[LLAMA3], "a 1234567\n\n  x"),
            ["a", " ", "123", "456", "7", "\n\n", " ", " x"]
        );
        assert_eq!(split(&[QWEN2], "12"), ["1", "2"]);
    }

    #[test]
    fn regex_steps_compose() {
        // StarCoder: digits first, then GPT-2.
        assert_eq!(split(&[r"\p{N}", GPT2], "ab 12"), ["ab", " ", "1", "2"]);
        // A non-ASCII letter is a letter in the collapsed text.
        assert_eq!(split(&[r"\s?\p{L}+"], "x é!"), ["x", " é", "!"]);
        assert_eq!(split(&[r"\s+$"], "a  "), ["a", "  "]);
    }

    #[test]
    fn every_pre_tokenizer_compiles() {
        for name in [
            "default",
            "llama-bpe",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "falcon",
            "starcoder",
            "gpt-2",
            "qwen2",
            "qwen35",
            "poro-chat",
            "viking",
            "tekken",
            "chameleon",
            "gpt-4o",
            "jais-2",
            "bailingmoe",
            "seed-coder",
            "ufakzeka",
            "laguna",
            "exaone-moe",
            "minicpm5",
            "spark2_5",
            "youtu",
            "granite-embed-multi-97m",
        ] {
            let spec = crate::pre_table::pre_spec(name).unwrap();
            PreTokenizer::new(spec.regexes).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}
