//! Stop sequences over streamed text: text is released only once it cannot be the
//! beginning of a stop sequence, so a stop sequence never leaks, not even in part.

use crate::holdback::{Scan, scan};

/// What [`StopMatcher::push`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopPush {
    /// Text safe to release.
    pub text: String,
    /// The stop sequence that matched (generation should end), if any.
    pub stopped: Option<String>,
}

/// Matches a set of stop sequences against streamed text.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Appends `text`; returns what is safe to release and whether a stop matched
    /// (the matched sequence and everything after it are dropped).
    pub fn push(&mut self, text: &str) -> StopPush {
        self.held.push_str(text);
        let mut first: Option<(usize, &String)> = None;
        let mut safe = self.held.len();
        for stop in &self.stops {
            match scan(&self.held, stop) {
                Scan::Found(pos) => {
                    if first.is_none_or(|(p, _)| pos < p) {
                        first = Some((pos, stop));
                    }
                }
                Scan::Safe(n) => safe = safe.min(n),
            }
        }
        if let Some((pos, stop)) = first {
            let stop = stop.clone();
            let text = self.held[..pos].to_string();
            self.held.clear();
            return StopPush {
                text,
                stopped: Some(stop),
            };
        }
        let text = self.held[..safe].to_string();
        self.held.drain(..safe);
        StopPush {
            text,
            stopped: None,
        }
    }

    /// Ends the stream: held text that never became a stop sequence is released.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.text);
            if r.stopped.is_some() {
                return (out, r.stopped);
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    #[test]
    fn stop_split_across_pieces_never_leaks() {
        let stops = vec!["END".to_string()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("abc E").text, "abc ");
        assert_eq!(m.push("N").text, "");
        let r = m.push("Dxyz");
        assert_eq!(r.text, "");
        assert_eq!(r.stopped.as_deref(), Some("END"));
    }

    #[test]
    fn false_start_is_released() {
        assert_eq!(
            run(&["END"], &["a E", "Nx", "y"]),
            ("a ENxy".to_string(), None)
        );
        assert_eq!(run(&["END"], &["a EN"]), ("a EN".to_string(), None));
    }

    #[test]
    fn earliest_stop_wins() {
        assert_eq!(
            run(&["yz", "x"], &["wxyz"]),
            ("w".to_string(), Some("x".to_string()))
        );
        assert_eq!(run(&[], &["a", "b"]), ("ab".to_string(), None));
    }
}
