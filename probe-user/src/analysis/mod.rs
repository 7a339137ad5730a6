//! Analyses run in user space over the tracked state.

pub mod leaks;
pub mod steps;
