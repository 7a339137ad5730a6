//! Analyses run in user space over the tracked state.

pub mod decompose;
pub mod inefficient;
pub mod leaks;
pub mod steps;
