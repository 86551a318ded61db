//! Token text to id lookup without a second copy of the texts.
//!
//! A hash table of ids whose keys are the texts stored in the vocabulary; a text that
//! occurs under several ids maps to the last one (as llama.cpp's `token_to_id` map does).

use std::hash::BuildHasher;

use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

/// Text to id over a borrowed list of texts.
#[derive(Debug, Default)]
pub(crate) struct TextIndex {
    table: HashTable<u32>,
}

fn hash(text: &str) -> u64 {
    FxBuildHasher.hash_one(text)
}

impl TextIndex {
    /// Indexes `texts` (id = position; later duplicates win).
    pub fn new(texts: &[String]) -> TextIndex {
        let mut table = HashTable::with_capacity(texts.len());
        for (id, text) in texts.iter().enumerate() {
            let h = hash(text);
            match table.find_mut(h, |&other: &u32| texts[other as usize] == *text) {
                Some(slot) => *slot = id as u32,
                None => {
                    table.insert_unique(h, id as u32, |&other| hash(&texts[other as usize]));
                }
            }
        }
        TextIndex { table }
    }

    /// The id of `text` in `texts` (the list this index was built from).
    pub fn get(&self, texts: &[String], text: &str) -> Option<u32> {
        self.table
            .find(hash(text), |&id| texts[id as usize] == text)
            .copied()
    }

    /// Number of distinct texts.
    pub fn len(&self) -> usize {
        self.table.len()
    }
}
