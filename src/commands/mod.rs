//! The library side of commands that are more than a call into one module: one file out of the
//! images (`packfs cat`), the demo (`packfs demo`), reading every file through the read path (`packfs verify --data`), and the
//! summary of a request trace (`packfs trace summarize`). Argument parsing and progress bars stay
//! in `cli`.

pub mod cat;
pub mod demo;
pub mod trace_summary;
pub mod verify;
