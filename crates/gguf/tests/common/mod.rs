//! Shared generators and exercisers of the property tests (models and fixtures are
//! located by `ds4_testkit`).
#![allow(dead_code)]

pub mod arb;
pub mod exercise;
