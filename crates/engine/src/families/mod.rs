//! Model families, one file each, readable beside the reference they follow.

pub mod llama;
