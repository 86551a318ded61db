//! Typed reads of metadata values ([`FromValue`]), used by the typed getters of
//! [`GgufFile`](crate::GgufFile).
//!
//! Rules: an integer target accepts any GGUF integer type whose value fits (converters differ
//! in the width they write, e.g. `u32` or `u64` for a token id); `f32` accepts only `F32`, `f64`
//! accepts `F32` and `F64`; `bool` and strings accept only their own type; `Vec<T>` accepts an
//! array whose every element converts to `T`.

use crate::Value;

/// A Rust type that a metadata value can be read as.
pub trait FromValue<'a>: Sized {
    /// What the conversion accepts, for error messages (`"an integer that fits u32"`).
    fn expected() -> String;
    /// The converted value, or `None` if `value` has another type or is out of range.
    fn from_value(value: &'a Value) -> Option<Self>;
}

macro_rules! integer_from_value {
    ($($t:ty),*) => {$(
        impl<'a> FromValue<'a> for $t {
            fn expected() -> String {
                concat!("an integer that fits ", stringify!($t)).to_owned()
            }
            fn from_value(value: &'a Value) -> Option<Self> {
                value.as_i128().and_then(|v| <$t>::try_from(v).ok())
            }
        }
    )*};
}
integer_from_value!(u8, u16, u32, u64, usize, i8, i16, i32, i64);

impl<'a> FromValue<'a> for f32 {
    fn expected() -> String {
        "f32".to_owned()
    }
    fn from_value(value: &'a Value) -> Option<Self> {
        match *value {
            Value::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl<'a> FromValue<'a> for f64 {
    fn expected() -> String {
        "f32 or f64".to_owned()
    }
    fn from_value(value: &'a Value) -> Option<Self> {
        value.as_f64()
    }
}

impl<'a> FromValue<'a> for bool {
    fn expected() -> String {
        "bool".to_owned()
    }
    fn from_value(value: &'a Value) -> Option<Self> {
        value.as_bool()
    }
}

impl<'a> FromValue<'a> for &'a str {
    fn expected() -> String {
        "string".to_owned()
    }
    fn from_value(value: &'a Value) -> Option<Self> {
        value.as_str()
    }
}

impl<'a> FromValue<'a> for String {
    fn expected() -> String {
        "string".to_owned()
    }
    fn from_value(value: &'a Value) -> Option<Self> {
        value.as_str().map(str::to_owned)
    }
}

impl<'a> FromValue<'a> for &'a [Value] {
    fn expected() -> String {
        "array".to_owned()
    }
    fn from_value(value: &'a Value) -> Option<Self> {
        value.as_array()
    }
}

impl<'a> FromValue<'a> for &'a Value {
    fn expected() -> String {
        "any value".to_owned()
    }
    fn from_value(value: &'a Value) -> Option<Self> {
        Some(value)
    }
}

impl<'a, T: FromValue<'a>> FromValue<'a> for Vec<T> {
    fn expected() -> String {
        format!("array of {}", T::expected())
    }
    fn from_value(value: &'a Value) -> Option<Self> {
        value.as_array()?.iter().map(T::from_value).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_convert_when_they_fit() {
        assert_eq!(u32::from_value(&Value::U64(7)), Some(7));
        assert_eq!(u32::from_value(&Value::U64(1 << 32)), None);
        assert_eq!(u32::from_value(&Value::I32(-1)), None);
        assert_eq!(i64::from_value(&Value::U8(255)), Some(255));
        assert_eq!(usize::from_value(&Value::F32(1.0)), None);
    }

    #[test]
    fn floats_bools_strings_are_strict() {
        assert_eq!(f32::from_value(&Value::F64(1.5)), None);
        assert_eq!(f64::from_value(&Value::F32(1.5)), Some(1.5));
        assert_eq!(bool::from_value(&Value::U8(1)), None);
        assert_eq!(<&str>::from_value(&Value::String("a".into())), Some("a"));
    }

    #[test]
    fn vectors_convert_every_element() {
        let v = Value::Array(vec![Value::I32(1), Value::I32(-2)]);
        assert_eq!(Vec::<i32>::from_value(&v), Some(vec![1, -2]));
        assert_eq!(Vec::<u32>::from_value(&v), None);
        assert_eq!(Vec::<u32>::expected(), "array of an integer that fits u32");
    }
}
