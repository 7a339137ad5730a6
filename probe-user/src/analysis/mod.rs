//! Stage 4, analyzers fed online by `state` as each call is applied (and by `offline` from
//! saved dumps): owners ([`decompose`]), inefficient blocks ([`inefficient`]), step leaks and
//! gaps ([`steps`]), and the user's site of an allocation from its stacks ([`sites`]). They keep numbers; `output` writes their files (`output::decompose`,
//! and `output::leaks` for the blocks still live when a process ends).
//!
//! Uses `events` (pool kinds), `settings` (`--drop-frames`) and `log`. Never `state` (which feeds them), `output`, `trace`,
//! `session`, `report` or `agent` (tests/layout.rs checks it).

pub mod decompose;
pub mod inefficient;
pub mod sites;
pub mod steps;
