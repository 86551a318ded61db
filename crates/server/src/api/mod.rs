//! The HTTP API adapters: each turns its API's request into a conversation or prompt
//! for the worker and the worker's output into its API's response and stream format.

pub mod anthropic;
pub mod body;
pub mod common;
pub mod constraints;
pub mod error;
pub mod models;
pub mod openai_chat;
pub mod openai_common;
pub mod openai_completions;
pub mod openai_responses;
pub mod stream;
