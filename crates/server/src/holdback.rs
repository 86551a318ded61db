//! Finding a marker (a stop sequence, a `<tool_call>` tag) in streamed text without
//! ever releasing bytes that might turn out to be the start of it.

/// Where a marker stands in a buffer of streamed text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// The marker starts at this byte offset.
    Found(usize),
    /// Not found; the first `n` bytes are safe to release (the rest may begin the
    /// marker once more text arrives). Always a char boundary.
    Safe(usize),
}

/// Looks for `marker` in `buf`. An empty marker never matches.
pub fn scan(buf: &str, marker: &str) -> Scan {
    if marker.is_empty() {
        return Scan::Safe(buf.len());
    }
    if let Some(pos) = buf.find(marker) {
        return Scan::Found(pos);
    }
    Scan::Safe(buf.len() - partial_suffix(buf, marker))
}

/// The length of the longest suffix of `buf` that is a proper prefix of `marker`,
/// measured on char boundaries.
pub fn partial_suffix(buf: &str, marker: &str) -> usize {
    let max = marker.len().saturating_sub(1).min(buf.len());
    (1..=max)
        .rev()
        .find(|&n| buf.is_char_boundary(buf.len() - n) && marker.starts_with(&buf[buf.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_and_holds_back() {
        assert_eq!(scan("abc<tool_call>x", "<tool_call>"), Scan::Found(3));
        assert_eq!(scan("abc<tool", "<tool_call>"), Scan::Safe(3));
        assert_eq!(scan("abc<", "<tool_call>"), Scan::Safe(3));
        assert_eq!(scan("abc", "<tool_call>"), Scan::Safe(3));
        assert_eq!(scan("", "x"), Scan::Safe(0));
        assert_eq!(scan("abc", ""), Scan::Safe(3));
    }

    #[test]
    fn respects_char_boundaries() {
        // "é" is two bytes: the held-back suffix is the whole character.
        assert_eq!(scan("aé", "éb"), Scan::Safe(1));
        assert_eq!(partial_suffix("aé", "b"), 0);
    }
}
