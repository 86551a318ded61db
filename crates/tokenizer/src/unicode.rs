//! Code point classes used by the pre-tokenizers, and GPT-2's byte-to-character map.
//!
//! The classes are the Unicode general-category groups that llama.cpp's pre-tokenizer
//! regexes test (`\p{L}`, `\p{N}`, `\p{P}`, `\p{S}`, `\p{M}`, `\p{Z}`, `\p{C}`), from the
//! Unicode 15.1 table in [`crate::unicode_table`] (the version llama.cpp's
//! `src/unicode-data.cpp` is generated from). White space is Unicode's `White_Space`
//! property (25 code points), as in llama.cpp.
//!
//! The byte map is GPT-2's `bytes_to_unicode`: printable Latin-1 bytes stand for
//! themselves, the other 68 bytes map to U+0100.. in byte order. Byte-level BPE
//! vocabularies store their tokens in this alphabet.

use std::sync::OnceLock;

use crate::unicode_table::RANGES;

/// The general-category group of a code point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Unassigned (`Cn`).
    Unassigned,
    Letter,
    Number,
    Punctuation,
    Symbol,
    Mark,
    Separator,
    /// Control, format, private use, surrogate (`Cc`, `Cf`, `Co`, `Cs`).
    Other,
}

impl Class {
    fn from_code(code: u8) -> Class {
        match code {
            1 => Class::Letter,
            2 => Class::Number,
            3 => Class::Punctuation,
            4 => Class::Symbol,
            5 => Class::Mark,
            6 => Class::Separator,
            7 => Class::Other,
            _ => Class::Unassigned,
        }
    }
}

/// Classes of the Basic Multilingual Plane, expanded once for fast lookup.
fn bmp_classes() -> &'static [u8] {
    static TABLE: OnceLock<Vec<u8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = vec![0u8; 0x10000];
        for (i, &(start, code)) in RANGES.iter().enumerate() {
            let end = RANGES.get(i + 1).map_or(0x11_0000, |r| r.0);
            let (start, end) = (start as usize, (end as usize).min(0x10000));
            if start < end {
                table[start..end].fill(code);
            }
        }
        table
    })
}

/// The class of `c`.
pub(crate) fn class_of(c: char) -> Class {
    let cp = c as u32;
    if cp < 0x10000 {
        return Class::from_code(bmp_classes()[cp as usize]);
    }
    let i = RANGES.partition_point(|&(start, _)| start <= cp);
    Class::from_code(RANGES[i - 1].1)
}

/// Unicode `White_Space` (the same 25 code points as llama.cpp's table).
pub(crate) fn is_whitespace(c: char) -> bool {
    matches!(
        c,
        '\u{09}'..='\u{0D}'
            | ' '
            | '\u{85}'
            | '\u{A0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200A}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202F}'
            | '\u{205F}'
            | '\u{3000}'
    )
}

/// The flags llama.cpp's hand-written splitters test for one code point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flags {
    pub class: Class,
    pub whitespace: bool,
}

impl Flags {
    pub fn of(c: char) -> Flags {
        Flags {
            class: class_of(c),
            whitespace: is_whitespace(c),
        }
    }
    pub fn is_letter(self) -> bool {
        self.class == Class::Letter
    }
    pub fn is_number(self) -> bool {
        self.class == Class::Number
    }
    pub fn is_mark(self) -> bool {
        self.class == Class::Mark
    }
}

/// GPT-2's byte-to-character table: `BYTE_CHARS[b]` stands for byte `b`.
pub(crate) fn byte_chars() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut next = 0x100u32;
        for (b, slot) in table.iter_mut().enumerate() {
            let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
            let cp = if printable {
                b as u32
            } else {
                next += 1;
                next - 1
            };
            *slot = char::from_u32(cp).unwrap_or('\u{FFFD}');
        }
        table
    })
}

/// The byte a GPT-2 alphabet character stands for, if it is one of the 256.
pub(crate) fn char_byte(c: char) -> Option<u8> {
    static TABLE: OnceLock<Vec<Option<u8>>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = vec![None; 0x144];
        for (b, &c) in byte_chars().iter().enumerate() {
            table[c as usize] = Some(b as u8);
        }
        table
    });
    table.get(c as usize).copied().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_round_trips() {
        let chars = byte_chars();
        for b in 0..=255u8 {
            assert_eq!(char_byte(chars[b as usize]), Some(b));
        }
        // GPT-2: space is U+0120 ('Ġ'), newline U+010A ('Ċ').
        assert_eq!(chars[b' ' as usize], '\u{120}');
        assert_eq!(chars[b'\n' as usize], '\u{10A}');
        assert_eq!(char_byte('\u{144}'), None);
    }

    #[test]
    fn classes_follow_unicode() {
        assert_eq!(class_of('a'), Class::Letter);
        assert_eq!(class_of('é'), Class::Letter);
        assert_eq!(class_of('7'), Class::Number);
        assert_eq!(class_of('½'), Class::Number);
        assert_eq!(class_of('!'), Class::Punctuation);
        assert_eq!(class_of('$'), Class::Symbol);
        assert_eq!(class_of('\u{301}'), Class::Mark);
        assert_eq!(class_of(' '), Class::Separator);
        assert_eq!(class_of('\n'), Class::Other);
        assert_eq!(class_of('\u{E000}'), Class::Other);
        assert_eq!(class_of('\u{378}'), Class::Unassigned);
        // Unicode 15.1 additions (CJK extension I) are letters; Unicode 16 ones are not yet.
        assert_eq!(class_of('\u{2EBF0}'), Class::Letter);
        assert_eq!(class_of('\u{1C89}'), Class::Unassigned);
        assert_eq!(class_of('😀'), Class::Symbol);
    }
}
