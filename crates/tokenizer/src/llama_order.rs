//! The order in which llama.cpp visits its text-to-id map (placeholder: id order).

/// Token ids in llama.cpp's visiting order.
pub(crate) fn llama_visit_order(texts: &[String]) -> Vec<u32> {
    (0..texts.len() as u32).collect()
}
