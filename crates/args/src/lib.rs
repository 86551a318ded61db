//! Value parsers for the numeric flags of every `ds4-server` subcommand, so that a bad
//! value gets the same message whatever the flag:
//!
//! ```text
//! error: invalid value '-5' for '--ctx <N>': must be a whole number, at least 1
//! error: invalid value '3' for '--top-p <P>': must be a number from 0 to 1
//! ```
//!
//! clap names the flag and the value; these parsers say the range. They are plain
//! functions `&str -> Result<T, String>`, which clap takes as `value_parser`:
//!
//! ```
//! #[derive(clap::Parser)]
//! struct Args {
//!     #[arg(long, allow_negative_numbers = true, value_parser = ds4_args::int::<usize>(1..))]
//!     ctx: Option<usize>,
//! }
//! ```
//!
//! Every numeric flag also sets `allow_negative_numbers = true`: without it clap takes
//! `-5` for an unknown flag (`unexpected argument '-5' found`) before a parser sees it.
//! `ds4-server`'s own tests walk all its flags and check both.

use std::fmt::Display;
use std::ops::{Bound, RangeBounds};
use std::time::Duration;

/// The integer types flags use.
pub trait Int: Copy + Display + Send + Sync + 'static {
    const MIN: i128;
    const MAX: i128;
    fn from_i128(v: i128) -> Self;
    fn to_i128(self) -> i128;
}

macro_rules! int {
    ($($t:ty),*) => {$(
        impl Int for $t {
            const MIN: i128 = <$t>::MIN as i128;
            const MAX: i128 = <$t>::MAX as i128;
            fn from_i128(v: i128) -> Self {
                v as $t
            }
            fn to_i128(self) -> i128 {
                self as i128
            }
        }
    )*};
}
int!(u16, u32, u64, usize, i32, i64);

/// The closed range `[lo, hi]` of `range` within `T`.
fn int_bounds<T: Int>(range: &impl RangeBounds<T>) -> (i128, i128) {
    let lo = match range.start_bound() {
        Bound::Included(v) => v.to_i128(),
        Bound::Excluded(v) => v.to_i128() + 1,
        Bound::Unbounded => T::MIN,
    };
    let hi = match range.end_bound() {
        Bound::Included(v) => v.to_i128(),
        Bound::Excluded(v) => v.to_i128() - 1,
        Bound::Unbounded => T::MAX,
    };
    (lo.max(T::MIN), hi.min(T::MAX))
}

/// What an integer in `[lo, hi]` must be, e.g. `a whole number from 0 to 65535`, or
/// `a whole number, at least 1` when `hi` is only the type's (huge) limit.
fn int_range_text(lo: i128, hi: i128, max: i128) -> String {
    if hi == max && hi >= i32::MAX as i128 {
        format!("a whole number, at least {lo}")
    } else {
        format!("a whole number from {lo} to {hi}")
    }
}

/// A parser of whole numbers in `range`, e.g. `int::<usize>(1..)`.
pub fn int<T: Int>(
    range: impl RangeBounds<T>,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static {
    let (lo, hi) = int_bounds(&range);
    let must = format!("must be {}", int_range_text(lo, hi, T::MAX));
    move |s: &str| match s.trim().parse::<i128>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(T::from_i128(v)),
        _ => Err(must.clone()),
    }
}

/// The float types flags use.
pub trait Real: Copy + Send + Sync + 'static {
    fn from_f64(v: f64) -> Self;
}

impl Real for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl Real for f64 {
    fn from_f64(v: f64) -> Self {
        v
    }
}

/// What a number in `range` must be, e.g. `a number from 0 to 2`,
/// `a number greater than 0`.
fn real_range_text(what: &str, range: &(Bound<f64>, Bound<f64>)) -> String {
    match *range {
        (Bound::Included(lo), Bound::Included(hi)) => format!("{what} from {lo} to {hi}"),
        (Bound::Included(lo), Bound::Excluded(hi)) => {
            format!("{what} from {lo} to less than {hi}")
        }
        (Bound::Excluded(lo), Bound::Unbounded) => format!("{what} greater than {lo}"),
        (Bound::Included(lo), Bound::Unbounded) => format!("{what}, at least {lo}"),
        (Bound::Excluded(lo), Bound::Included(hi)) => {
            format!("{what} greater than {lo} and at most {hi}")
        }
        (Bound::Excluded(lo), Bound::Excluded(hi)) => format!("{what} between {lo} and {hi}"),
        (Bound::Unbounded, Bound::Included(hi)) => format!("{what}, at most {hi}"),
        (Bound::Unbounded, Bound::Excluded(hi)) => format!("{what} less than {hi}"),
        (Bound::Unbounded, Bound::Unbounded) => what.to_string(),
    }
}

fn bounds(range: &impl RangeBounds<f64>) -> (Bound<f64>, Bound<f64>) {
    (range.start_bound().cloned(), range.end_bound().cloned())
}

/// A parser of (finite) numbers in `range`, e.g. `real::<f32>(0.0..=2.0)`.
pub fn real<T: Real>(
    range: impl RangeBounds<f64> + Clone + Send + Sync + 'static,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static {
    let must = format!("must be {}", real_range_text("a number", &bounds(&range)));
    move |s: &str| match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && range.contains(&v) => Ok(T::from_f64(v)),
        _ => Err(must.clone()),
    }
}

/// A parser of a duration given in (fractional) seconds in `range`, e.g.
/// `seconds(POSITIVE)`.
pub fn seconds(
    range: impl RangeBounds<f64> + Clone + Send + Sync + 'static,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    let must = format!(
        "must be {}",
        real_range_text("a number of seconds", &bounds(&range))
    );
    move |s: &str| match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && range.contains(&v) => {
            Duration::try_from_secs_f64(v).map_err(|_| must.clone())
        }
        _ => Err(must.clone()),
    }
}

/// The range of positive numbers (0 excluded), for [`real`] and [`seconds`].
pub const POSITIVE: (Bound<f64>, Bound<f64>) = (Bound::Excluded(0.0), Bound::Unbounded);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_say_their_range() {
        let ctx = int::<usize>(1..);
        assert_eq!(ctx("4096"), Ok(4096));
        assert_eq!(ctx(" 7 "), Ok(7));
        for bad in [
            "-5",
            "0",
            "abc",
            "1.5",
            "",
            "99999999999999999999999999999999999999999",
        ] {
            assert_eq!(
                ctx(bad),
                Err("must be a whole number, at least 1".into()),
                "{bad}"
            );
        }
        let port = int::<u16>(..);
        assert_eq!(port("65535"), Ok(65535));
        assert_eq!(
            port("65536"),
            Err("must be a whole number from 0 to 65535".into())
        );
        assert_eq!(
            port("-1"),
            Err("must be a whole number from 0 to 65535".into())
        );
        let top_k = int::<i32>(0..);
        assert_eq!(
            top_k("-3"),
            Err("must be a whole number, at least 0".into())
        );
        assert_eq!(top_k("2147483647"), Ok(i32::MAX));
        assert_eq!(
            int::<u64>(1..=4)("5"),
            Err("must be a whole number from 1 to 4".into())
        );
        assert_eq!(int::<u64>(1..5)("4"), Ok(4));
    }

    #[test]
    fn numbers_say_their_range() {
        let temp = real::<f32>(0.0..=2.0);
        assert_eq!(temp("0.7"), Ok(0.7));
        assert_eq!(temp("2"), Ok(2.0));
        for bad in ["-0.1", "2.01", "NaN", "inf", "hot"] {
            assert_eq!(
                temp(bad),
                Err("must be a number from 0 to 2".into()),
                "{bad}"
            );
        }
        let positive = real::<f64>(POSITIVE);
        assert_eq!(positive("0"), Err("must be a number greater than 0".into()));
        assert_eq!(positive("1e-3"), Ok(1e-3));
        assert_eq!(
            real::<f64>(0.0..)("-1"),
            Err("must be a number, at least 0".into())
        );
        assert_eq!(
            real::<f64>(0.0..1.0)("1"),
            Err("must be a number from 0 to less than 1".into())
        );
    }

    #[test]
    fn seconds_are_durations() {
        let s = seconds(POSITIVE);
        assert_eq!(s("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(
            s("-1"),
            Err("must be a number of seconds greater than 0".into())
        );
        assert_eq!(
            s("0"),
            Err("must be a number of seconds greater than 0".into())
        );
        assert_eq!(
            s("1e300"),
            Err("must be a number of seconds greater than 0".into())
        );
    }
}
