//! Model families, one file each, readable beside the reference they follow.

#[cfg(test)]
mod bounds;
pub mod deepseek4;
pub mod glm5_next;
pub mod llama;
mod state_file;
