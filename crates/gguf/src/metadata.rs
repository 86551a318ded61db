//! [`Metadata`]: the key/value section of a GGUF file, in file (or insertion) order, with
//! lookup by key.

use std::collections::HashMap;

use crate::Value;

/// Metadata key/values in file order; keys are unique.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// True if `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Position of `key` in file order.
    pub fn position(&self, key: &str) -> Option<usize> {
        self.index.get(key).copied()
    }

    /// Key/value pairs in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> + DoubleEndedIterator {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Keys in order.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> + DoubleEndedIterator {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// Sets `key` to `value`: replaces the value in place if the key exists (keeping its
    /// position) and returns the old value, else appends.
    pub fn insert(&mut self, key: impl Into<String>, value: Value) -> Option<Value> {
        let key = key.into();
        match self.index.get(&key) {
            Some(&i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
                None
            }
        }
    }

    /// Appends a new key; gives the value back if the key is already present.
    pub(crate) fn push_new(&mut self, key: &str, value: Value) -> Result<(), Value> {
        if self.index.contains_key(key) {
            return Err(value);
        }
        self.index.insert(key.to_owned(), self.entries.len());
        self.entries.push((key.to_owned(), value));
        Ok(())
    }
}

impl<'a> IntoIterator for &'a Metadata {
    type Item = (&'a str, &'a Value);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, Value)>,
        fn(&'a (String, Value)) -> (&'a str, &'a Value),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_insertion_order_and_replaces_in_place() {
        let mut m = Metadata::new();
        m.insert("b", Value::U8(1));
        m.insert("a", Value::U8(2));
        assert_eq!(m.insert("b", Value::U8(3)), Some(Value::U8(1)));
        assert_eq!(m.keys().collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(m.get("b"), Some(&Value::U8(3)));
        assert!(m.push_new("a", Value::U8(0)).is_err());
        assert_eq!(m.len(), 2);
    }
}
