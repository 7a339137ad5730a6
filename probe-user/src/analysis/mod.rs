//! Stage 4, analyses over the tracked state: owners ([`decompose`]), inefficient blocks
//! ([`inefficient`]) and step leaks and gaps ([`steps`]), fed online by `state` as calls are
//! applied (and by `offline` from saved dumps), and the leak report ([`leaks`]) drawn from the
//! blocks still live when a process ends.
//!
//! Uses `state` (blocks), `events` (pool kinds), `output` (to write their files), `digits`
//! and `log`. Never `trace`, `session`, `report` or `agent` (tests/layout.rs checks it).

pub mod decompose;
pub mod inefficient;
pub mod leaks;
pub mod steps;
