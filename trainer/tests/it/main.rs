//! lake-trainer's integration tests (one binary): parity with LeRobot 0.4.4's ACT and Diffusion, and a short
//! training run. They need the `torch` feature and a libtorch at run time; the parity tests
//! also need a LeRobot venv (`LAKE_LEROBOT_PYTHON`, else `~/.cache/lake/lerobot-venv`) and
//! are skipped, saying so, without one.

// Tests report skips and measured differences on stderr.
#![allow(clippy::print_stderr)]

mod common;
mod diffusion;
mod parity;
mod ranks;
mod run;
mod training;
