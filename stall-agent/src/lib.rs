//! stall's agent. The data path, one module per step:
//! kernel events → [`capture`] → [`decode`] → [`aggregate`] → [`correlate`]
//! → [`verdict`] → [`output`].
pub mod aggregate;
pub mod capture;
pub mod cli;
pub mod correlate;
pub mod daemon;
pub mod decode;
pub mod gpu;
pub mod output;
pub mod session;
pub mod units;
pub mod verdict;
